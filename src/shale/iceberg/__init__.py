"""Apache Iceberg tables over the stored blocks (docs/DESIGN.md, section 16): the metastore leader publishes
every committed change as one snapshot of one table per tenant and topic, whose data files are Shale's own
Parquet objects. ``spark_catalog_conf`` configures Spark's Iceberg catalog on the same tables."""

from shale.iceberg.catalog import identifier, open_catalog, spark_catalog_conf
from shale.iceberg.erasure import receipt_check
from shale.iceberg.http import mount_sync
from shale.iceberg.publisher import IcebergPublisher

__all__ = [
    "IcebergPublisher",
    "identifier",
    "mount_sync",
    "open_catalog",
    "receipt_check",
    "spark_catalog_conf",
]
