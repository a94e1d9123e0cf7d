"""``ReadOnlyIndex``: a read-only view of a metastore's state file, for every reader that changes nothing (queries,
``shale offsets show``, ``verify``, ``ledger``, ``trace``, ``locate``, ``metastore status``, ``bucket cleanup``'s
protected set, the status page). It has no log and no write path, never creates a state file, and a read cannot
hold the state's write lock. Its reads are ``IndexReads``, as the service's are; they see what is committed when
each statement runs.

``open_index_view`` (in ``shale.metastore.server``) gives this view for an embedded metastore and a
``MetastoreClient`` for a remote one; both fit the readers' small protocols. Only writers open a ``StateMachine``
(``tests/unit/test_state_writers.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shale.errors import ConfigError
from shale.index import IndexReader, connect, copy_state
from shale.metastore.reads import IndexReads


class ReadOnlyIndex(IndexReads):
    def __init__(self, path: Path, timeout: float | None = None, clock: Callable[[], float] = time.time) -> None:
        if not path.exists():
            raise ConfigError(f"no metastore state at {path}: nothing was ingested with this configuration yet "
                              "(check metastore.data_dir)")
        self.path = path
        super().__init__(IndexReader(lambda: connect(str(path), readonly=True)), timeout, clock)

    def status(self) -> dict[str, Any]:
        """An embedded metastore's status, as its single-node log reports it: term 1, every entry committed."""
        index, _ = self.reader.applied()
        return {"role": "single", "leader": None, "term": 1, "applied_index": index, "commit_index": index,
                "members": [], "has_quorum": True, "blocks": self.reader.count_blocks()}

    def snapshot(self, out: Path) -> None:
        """A consistent copy of the whole state (as ``MetastoreClient.snapshot`` gets a node's): SQLite's online
        backup in one step, one read transaction."""
        copy_state(self.path, out)
