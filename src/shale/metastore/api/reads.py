"""``IndexReads``: every read of the metastore's state, declared once. The service (``MetastoreService``, behind
the HTTP API and embedded), the read-only view of a state file (``read_only_index``) and the HTTP client
(``MetastoreClient``, a ``RemoteReads``) are all ``IndexReads``, so a reader types its metastore as one. The local
ones differ only in what happens before a read (``fresh``: the service counts the read and, where a read must be
current, runs the log's read barrier; the view reads what is committed when each statement runs) and in their
status.

A read declared with ``@served(path, key)`` is also a GET route: the HTTP API mounts one route per path from the
declarations (``http.mount_reads``), answering ``{key: value}``, and a ``RemoteReads`` answers the read by calling
that route and decoding ``key`` as the method's return type. Adding a read takes its query in the store of its
tables (``shale.index``; ``IndexReader`` for the blocks) and its declaration here; a route needs its rule in
``auth.RULES`` (closed until then). The few routes that page, filter by the caller or join two reads are written
by hand in http.py and client.py.
"""

from __future__ import annotations

import functools
import inspect
import time
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from pydantic import TypeAdapter

from shale.block import BlockMeta
from shale.errors import ConfigError
from shale.index import (
    CompactionState,
    IncarnationRow,
    IndexReader,
    LossRow,
    OffsetRow,
    SchemaVersionRow,
    TombstoneRow,
    connect,
    copy_state,
    parse_matchers,
)
from shale.metastore.rules import KEPT, erasure_rows, job_rows, lease_rows, queue_counts, restore_rows

P = ParamSpec("P")
R = TypeVar("R")

PAGE_LIMIT = 10_000
"""The most rows one list answer holds (``limit``): a tenant's blocks are paged with ``after``/``next``."""


@dataclass(frozen=True)
class Route:
    """How a read is served: ``GET path`` answers ``{key: value}``; ``params`` names a parameter's query name
    (``alias``) or bounds (``ge``, ``le``, ``pattern``), as FastAPI's ``Query`` takes them."""

    path: str
    key: str
    params: dict[str, dict[str, Any]] = field(default_factory=dict)


class Read(Generic[P, R]):
    """One read capability: its local answer (the method) and, with a ``route``, the GET that serves it."""

    def __init__(self, function: Callable[Concatenate[Any, P], R], route: Route | None) -> None:
        self.function = function
        self.route = route
        self.name = function.__name__
        self.__doc__ = function.__doc__

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> Read[P, R]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        if isinstance(instance, RemoteReads):
            return functools.partial(instance.remote, self)
        return types.MethodType(self.function, instance)

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        """The read's parameters after ``self``, their annotations resolved to types."""
        hints = typing.get_type_hints(self.function)
        parameters = list(inspect.signature(self.function).parameters.values())[1:]
        return inspect.Signature([p.replace(annotation=hints[p.name]) for p in parameters],
                                 return_annotation=hints["return"])

    @functools.cached_property
    def answer(self) -> TypeAdapter[Any]:
        """Encodes the answer for the route and decodes it in a remote view."""
        return TypeAdapter(self.signature.return_annotation)


def served(path: str, key: str, **params: dict[str, Any]) -> Callable[[Callable[Concatenate[Any, P], R]], Read[P, R]]:
    """Declare a read served at ``GET path`` (see ``Route``)."""
    return lambda function: Read(function, Route(path, key, params))


def served_reads() -> list[Read[Any, Any]]:
    """The reads with a route, in declaration order."""
    return [r for r in vars(IndexReads).values() if isinstance(r, Read) and r.route is not None]


class IndexReads:
    """Reads over ``reader``; block and label queries stop past ``query_timeout`` seconds. ``path``: the state
    file, for ``snapshot``."""

    def __init__(self, reader: IndexReader, query_timeout: float | None = None,
                 clock: Callable[[], float] = time.time, path: Path | None = None) -> None:
        self.reader = reader
        self.query_timeout = query_timeout
        self.clock = clock
        self.path = path

    def fresh(self, api: str, *, current: bool = True) -> None:
        """Before the read ``api``; ``current``: it must see every write acknowledged before it started."""

    def status(self) -> dict[str, Any]:
        """An embedded metastore's status, as its single-node log reports it: term 1, every entry committed."""
        index, _ = self.reader.applied()
        return {"role": "single", "leader": None, "term": 1, "applied_index": index, "commit_index": index,
                "members": [], "has_quorum": True, "blocks": self.reader.count_blocks()}

    def snapshot(self, out: Path) -> None:
        """A consistent copy of the whole state (as ``MetastoreClient.snapshot`` gets a node's): SQLite's online
        backup in one step, one read transaction."""
        if self.path is None:
            raise ConfigError("this view of the metastore's state has no state file to copy")
        copy_state(self.path, out)

    # -- blocks ---------------------------------------------------------------------------------

    @served("/v1/blocks", "blocks", tenants={"alias": "tenant"})
    def query_blocks(self, tenants: Sequence[str], start: int = 0, end: int = 2**62, selector: str = "",
                     group: str | None = None) -> list[BlockMeta]:
        matchers = parse_matchers(selector)
        self.fresh("query_blocks")
        return self.reader.query_blocks(list(tenants), start, end, matchers, group, self.query_timeout)

    @served("/v1/labels", "names", tenants={"alias": "tenant"})
    def label_names(self, tenants: Sequence[str], start: int = 0, end: int = 2**62,
                    selector: str = "") -> list[str]:
        matchers = parse_matchers(selector)
        self.fresh("label_names")
        return self.reader.label_names(list(tenants), start, end, matchers, self.query_timeout)

    @served("/v1/labels/{name}/values", "values", tenants={"alias": "tenant"})
    def label_values(self, name: str, tenants: Sequence[str], start: int = 0, end: int = 2**62,
                     selector: str = "") -> list[str]:
        matchers = parse_matchers(selector)
        self.fresh("label_values")
        return self.reader.label_values(name, list(tenants), start, end, matchers, self.query_timeout)

    def get_block(self, block_id: str) -> BlockMeta | None:
        self.fresh("get_block")
        return self.reader.get_block(block_id)

    def tenants(self) -> list[str]:
        self.fresh("tenants", current=False)
        return self.reader.tenants()

    def tenant_blocks(self, tenant: str, *, after: str = "", limit: int | None = None) -> list[BlockMeta]:
        """A tenant's blocks in id order: all of them, or the first ``limit`` with an id after ``after``."""
        self.fresh("tenant_blocks")
        return self.reader.tenant_blocks(tenant, after=after, limit=limit)

    @served("/v1/tenants/{tenant}/generations", "rules")
    def generation_rules(self, tenant: str) -> list[tuple[str, int, int, int]]:
        self.fresh("generation_rules")
        return self.reader.generation_rules(tenant)

    @served("/v1/tombstones", "tombstones", limit={"ge": 1, "le": PAGE_LIMIT})
    def tombstones(self, created_before: int | None = None, limit: int = 1000) -> list[TombstoneRow]:
        self.fresh("tombstones", current=False)
        return self.reader.tombstones(created_before, limit)

    @served("/v1/tenants/{tenant}/schemas", "schemas")
    def schema_versions(self, tenant: str, topic: str | None = None) -> list[SchemaVersionRow]:
        """The writer schemas the tenant's live blocks hold, per topic, group and generation."""
        self.fresh("schema_versions", current=False)
        return self.reader.schema_versions(tenant, topic)

    # -- offsets --------------------------------------------------------------------------------

    def offsets(self, group: str | None = None, generation: int | None = None) -> list[OffsetRow]:
        self.fresh("offsets")
        return self.reader.offsets(group, generation)

    def offset_history(self, group: str | None = None,
                       generation: int | None = None) -> tuple[list[IncarnationRow], list[LossRow]]:
        """Past topic incarnations and acknowledged losses."""
        self.fresh("offset_history")
        return self.reader.incarnations(group, generation), self.reader.losses(group, generation)

    # -- the status page, `shale metastore status` and the operators' lists -----------------------

    def tenant_totals(self) -> list[tuple[str, int, int, int]]:
        self.fresh("tenant_totals", current=False)
        return self.reader.tenant_totals()

    def level_histogram(self, bucket_ms: int) -> list[tuple[str, int, int, int]]:
        self.fresh("level_histogram", current=False)
        return self.reader.level_histogram(bucket_ms)

    @served("/v1/compaction/jobs", "jobs")
    def compaction_jobs(self) -> list[dict[str, Any]]:
        self.fresh("compaction_jobs", current=False)
        return job_rows(CompactionState(self.reader.conn), int(self.clock() * 1000))

    @served("/v1/compaction/jobs", "queue")
    def compaction_queue(self) -> dict[str, int]:
        self.fresh("compaction_queue", current=False)
        return queue_counts(CompactionState(self.reader.conn))

    @served("/v1/ingest/leases", "leases")
    def ingest_leases(self, group: str | None = None) -> list[dict[str, Any]]:
        """Every shard's ingest lease as of now (``holder`` empty when nobody holds it, or its lease was granted
        under an older shard map), of one group or all. Not linearized: a standby watches these rows, and a read
        barrier would write a no-op to the log on every look."""
        self.fresh("ingest_leases", current=False)
        return lease_rows(self.reader.conn, int(self.clock() * 1000), group)

    @served("/v1/erasures", "erasures", erasure={"alias": "id", "pattern": r"^[0-9a-f]{16}$"},
            limit={"ge": 1, "le": 1000}, before={"ge": 0})
    def erasures(self, erasure: str | None = None, limit: int = 100,
                 before: int | None = None) -> list[dict[str, Any]]:
        """Erasures newest first, or the one named, with the blocks rewritten for each (``shale erase status``);
        ``before``: the page after the one whose last row's ``seq`` it is (``every_erasure`` pages).
        Over HTTP: needs a reader of every tenant. Linearized: it is the proof an erasure finished, so a node that
        restarted behind the others must not report it unfinished again."""
        self.fresh("erasures")
        return erasure_rows(self.reader.conn, erasure, limit, before)

    @served("/v1/restores", "restores", limit={"ge": 1, "le": KEPT})
    def restores(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest runs of ``shale restore`` first. Over HTTP: needs a reader of every tenant."""
        self.fresh("restores")  # linearized, as erasures: a finished run never reads as running again
        return restore_rows(self.reader.conn, limit)


class RemoteReads(IndexReads):
    """``IndexReads`` answered by a server: a served read is one GET of its route (``get``); the other reads are
    written by the subclass, and those the API does not serve (the status page's totals) it does not answer."""

    def get(self, path: str, **params: Any) -> Any:
        """The decoded JSON answer of ``GET path?params`` (a ``None`` parameter is left out)."""
        raise NotImplementedError

    def remote(self, read: Read[Any, Any], /, *args: Any, **kwargs: Any) -> Any:
        assert read.route is not None, f"{read.name} is not served over HTTP"
        arguments = read.signature.bind(*args, **kwargs)
        arguments.apply_defaults()
        in_path = {k: v for k, v in arguments.arguments.items() if "{" + k + "}" in read.route.path}
        query = {read.route.params.get(k, {}).get("alias", k): list(v) if isinstance(v, list | tuple) else v
                 for k, v in arguments.arguments.items() if k not in in_path}
        return read.answer.validate_python(self.get(read.route.path.format(**in_path), **query)[read.route.key])


def read_only_index(path: Path, timeout: float | None = None, clock: Callable[[], float] = time.time) -> IndexReads:
    """A read-only view of a metastore's state file, for every reader that changes nothing (queries, ``shale
    offsets show``, ``verify``, ``ledger``, ``trace``, ``locate``, ``metastore status``, ``bucket cleanup``'s
    protected set, the status page). It has no log and no write path, never creates a state file, and a read cannot
    hold the state's write lock; it reads what is committed when each statement runs. ``open_index_view`` (in
    ``shale.metastore.api.server``) gives this view for an embedded metastore and a ``MetastoreClient`` for a remote
    one. Only writers open a ``StateMachine`` (``tests/unit/test_state_writers.py``)."""
    if not path.exists():
        raise ConfigError(f"no metastore state at {path}: nothing was ingested with this configuration yet "
                          "(check metastore.data_dir)")
    return IndexReads(IndexReader(lambda: connect(str(path), readonly=True)), timeout, clock, path)
