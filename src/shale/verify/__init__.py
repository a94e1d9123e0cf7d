"""The auditor (guarantee 1): what Kafka holds against what the metastore committed and the bucket stores. It reads
Kafka, the index and the blocks and writes nothing.

The public face: ``verify_topic`` reconciles one group's topic with Kafka, offset by offset (``shale verify``,
a ``VerifyReport``); ``build_ledger`` answers "is this day complete?" from the committed watermarks (``shale
ledger``, a ``Ledger``); ``StoredBlocks`` is what both read from the metastore (the embedded service, the read-only
view and the HTTP client fit; ``NothingStored`` is a metastore that never ingested); ``group_blocks`` lists a
group's live blocks of a topic. The sequence is in this package's README and docs/design/ingest.md 10.6. Its names
are imported on first use: the reconciliation imports the Kafka client and pyarrow.
"""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from shale.verify.ledger import Ledger, build_ledger
    from shale.verify.reconcile import NothingStored, StoredBlocks, VerifyReport, group_blocks, verify_topic

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "Ledger": "ledger",
    "build_ledger": "ledger",
    "NothingStored": "reconcile",
    "StoredBlocks": "reconcile",
    "VerifyReport": "reconcile",
    "group_blocks": "reconcile",
    "verify_topic": "reconcile",
})

__all__ = [
    "Ledger",
    "NothingStored",
    "StoredBlocks",
    "VerifyReport",
    "build_ledger",
    "group_blocks",
    "verify_topic",
]
