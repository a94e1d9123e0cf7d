"""Repair of overlapping and damaged blocks (``shale bucket repair``): ``scan_tenant`` reads, ``plan_repair``
decides (pure), ``apply_plan`` changes the bucket only with ``--apply``. The sequence is in this package's README.
Its names are imported on first use: the scan imports the Kafka client and the metastore's."""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from shale.repair.apply import apply_plan
    from shale.repair.build import Builder, LocalBuilder, SparkBuilder
    from shale.repair.model import Plan
    from shale.repair.plan import plan_repair
    from shale.repair.scan import Scan, current_parsers, kafka_state, scan_tenant

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "apply_plan": "apply",
    "Builder": "build",
    "LocalBuilder": "build",
    "SparkBuilder": "build",
    "Plan": "model",
    "plan_repair": "plan",
    "Scan": "scan",
    "current_parsers": "scan",
    "kafka_state": "scan",
    "scan_tenant": "scan",
})

__all__ = [
    "Builder",
    "LocalBuilder",
    "Plan",
    "Scan",
    "SparkBuilder",
    "apply_plan",
    "current_parsers",
    "kafka_state",
    "plan_repair",
    "scan_tenant",
]
