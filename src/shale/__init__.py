"""Shale: Kafka topics kept in object storage as immutable, queryable blocks, exactly once.

The one-line door for reading is ``shale.read`` (``shale.query.table``); every package's face is its
``__init__``. Nothing is imported until asked for: Spark's Python workers import ``shale`` too."""

from shale.exports import lazy_exports as _lazy_exports

__all__ = ["read"]

__getattr__ = _lazy_exports(__name__, {"read": "query"})
