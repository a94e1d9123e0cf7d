"""The Spark task of ``shale reprocess`` (``job.py`` plans the rounds and commits them): one partition's backup
records of one round's range, parsed into partition-group blocks. A module of its own so that a Spark Python
worker imports only what a task needs, not the driver's metastore client and Spark planning."""

from __future__ import annotations

import pyarrow as pa

from shale.block import backup_rows
from shale.config import BucketConfig, SchemaRegistryConfig
from shale.encoder import GroupSpec, Written, encode_written
from shale.ingest import BatchPlan, ChunkWriter, chunk_bytes
from shale.objstore import task_bucket
from shale.reprocess.wire import decode_spec, decode_work
from shale.resources import PeakMemory
from shale.schemas import RegistryClient


def run_partition(work_json: str, spec_json: str, bucket_config: BucketConfig,
                  registry: SchemaRegistryConfig | None = None) -> str:
    """A Spark task: parse one partition's backup records of one round's range into partition-group blocks. Its
    input and output are encoded by ``shale.reprocess.wire``; the bucket's and the registry's configurations are
    pickled (their secrets are masked in JSON)."""
    task, round_ = decode_work(work_json), decode_spec(spec_json)
    work, metas = task.range, task.blocks
    ingest = round_.ingest if registry is None else round_.ingest.model_copy(update={"schema_registry": registry})
    spec = GroupSpec("partition", round_.generation, bucket_config, ingest)
    if round_.known.schemas:
        round_.known.remember(RegistryClient(ingest.schema_registry))
    bucket = task_bucket(bucket_config)
    tables = [t for meta in metas for t in backup_rows(bucket, meta, work.topic, work.partition, work.start, work.end)]
    size = chunk_bytes(round_.task_bytes, PeakMemory().start, "partition")
    writer = ChunkWriter(spec, bucket, BatchPlan(round_.read_time_ms, [work]), size,
                         derived_from=[m.id for m in metas])
    written: list[Written] = []
    if tables:
        table = pa.concat_tables(tables, promote_options="permissive").sort_by([("offset", "ascending")])
        for piece in table.to_batches(max_chunksize=10_000):
            written += writer.add_table(pa.Table.from_batches([piece]))
    written += writer.finish()
    return encode_written(written)
