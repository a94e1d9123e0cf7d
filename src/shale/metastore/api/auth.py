"""Who may call what on the metastore's HTTP API: tokens, roles, scopes, and the rule of every route.

A caller presents a bearer token (``Authorization: Bearer <token>``; a browser logs in to the status page with
the token once and then holds a session cookie, see ``sessions.py``). The metastore keeps only SHA-256 digests of
tokens, in a TOML file
(``metastore.tokens_file``), each with a name, a role and a scope::

    [[token]]
    name = "grafana"
    role = "reader"          # admin | ingest | compactor | reader
    tenants = ["acme"]       # reader: the tenants it may read ("*": every tenant)
    sha256 = "9f86d0..."     # ingest tokens list their groups instead: groups = ["backup"]

Digests are compared with ``hmac.compare_digest`` against every entry, so the time taken says nothing about
which entry (if any) matched. Roles: ``admin`` may do everything; ``ingest`` commits offsets of its groups;
``compactor`` polls for compaction jobs and reports them; ``reader`` queries its tenants and reads the status;
``peer`` (never in the file: derived from the cluster secret) is how metastore nodes call each other. Every route
has a rule in ``RULES``; a route without one needs ``admin``, so a new route is closed until someone opens it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
import threading
import time
import tomllib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shale.errors import ConfigError

log = logging.getLogger(__name__)
Role = Literal["admin", "ingest", "compactor", "reader", "peer"]
ALL = "*"
LOCAL_ADMIN_TOKEN = "admin.token"  # noqa: S105 - a file name
TOKEN_PREFIX = "shale_"  # noqa: S105 - a prefix, not a token
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class TokenEntry(BaseModel):
    """One line of the tokens file. The token itself is never stored, only its SHA-256 digest."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=_NAME.pattern)
    role: Literal["admin", "ingest", "compactor", "reader"]
    groups: list[str] = Field(default_factory=list, description="ingest: groups it may commit ('*': any)")
    tenants: list[str] = Field(default_factory=list, description="reader: tenants it may read ('*': every)")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @model_validator(mode="after")
    def _scope(self) -> TokenEntry:
        if self.role == "ingest" and not self.groups:
            raise ValueError("an ingest token lists the groups it may commit, e.g. groups = [\"backup\"]")
        if self.role == "reader" and not self.tenants:
            raise ValueError("a reader token lists its tenants, e.g. tenants = [\"acme\"] (or [\"*\"] for every one)")
        return self


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: the token's name (safe to log), role and scopes."""

    name: str
    role: Role
    groups: frozenset[str] = frozenset()
    tenants: frozenset[str] = frozenset()

    def __str__(self) -> str:
        scope = (f", groups {','.join(sorted(self.groups))}" if self.groups else "") + \
                (f", tenants {','.join(sorted(self.tenants))}" if self.tenants else "")
        return f"token {self.name!r} (role {self.role}{scope})"


# -- needs: what one call requires --------------------------------------------------------------------------


@dataclass(frozen=True)
class Need:
    """What a call needs: a role, and for ``ingest`` a group (None: any group), for ``reader`` tenants (None:
    any reader; ``(ALL,)``: a reader of every tenant). ``admin`` meets every need, ``alternatives`` are
    further needs any one of which also suffices."""

    role: Role
    group: str | None = None
    tenants: tuple[str, ...] | None = None
    alternatives: tuple[Need, ...] = ()

    def met_by(self, who: Principal) -> bool:
        if who.role == "admin" or any(a.met_by(who) for a in self.alternatives):
            return True
        if who.role != self.role:
            return False
        if self.role == "ingest":
            return self.group is None or ALL in who.groups or self.group in who.groups
        if self.role == "reader" and self.tenants is not None:
            return ALL in who.tenants or (ALL not in self.tenants and set(self.tenants) <= who.tenants)
        return True

    def describe(self) -> dict[str, Any]:
        """The JSON a 403 carries: the role needed and, where it matters, the group or tenants."""
        needed: dict[str, Any] = {"role": self.role}
        if self.group is not None:
            needed["group"] = self.group
        if self.tenants is not None:
            needed["tenants"] = list(self.tenants)
        if self.alternatives:
            needed["or"] = [a.describe() for a in self.alternatives]
        return needed

    def __str__(self) -> str:
        text = f"role {self.role}"
        if self.group is not None:
            text += f" for group {self.group}"
        if self.tenants is not None:
            plural = "s" if len(self.tenants) > 1 else ""
            text += " for every tenant" if ALL in self.tenants else f" for tenant{plural} {', '.join(self.tenants)}"
        if self.role == "admin":
            return text
        return " or ".join([text, *(str(a).removesuffix(" or role admin") for a in self.alternatives), "role admin"])


ADMIN = Need("admin")
PEER = Need("peer")
COMPACTOR = Need("compactor")
SOME_READER = Need("reader")
EVERY_TENANT = Need("reader", tenants=(ALL,))
ANY_ROLE = Need("reader", alternatives=(Need("ingest"), COMPACTOR, PEER))


def ingest(group: str) -> Need:
    return Need("ingest", group=group)


def read(tenants: Iterable[str]) -> Need:
    return Need("reader", tenants=tuple(sorted(set(tenants))))


INGEST_COMMANDS = frozenset({"CommitIngestBatch", "AcquireIngestLease", "RenewIngestLease", "ReleaseIngestLease"})


def command_need(kind: str, group: str | None = None) -> Need:
    """The need of a command sent to ``POST /v1/commands``: an ingest commit and an ingest lease's commands need
    their group; every other kind (block replacement, generation switches, retention, tombstones, failure limits,
    and any kind added later) needs ``admin``."""
    if kind in INGEST_COMMANDS and group is not None:
        return ingest(group)
    return ADMIN


# -- the rule of every route --------------------------------------------------------------------------------

Rule = Callable[[Any], Awaitable[Need | None]]  # takes the request; None means the route is open


def _const(need: Need | None) -> Rule:
    async def rule(request: Any) -> Need | None:
        return need
    return rule


def _query_tenants(request: Any) -> list[str]:
    return list(request.query_params.getlist("tenant"))


async def _tenants_in_query(request: Any) -> Need:
    return read(_query_tenants(request))


async def _tenant_in_path(request: Any) -> Need:
    return read([request.path_params["tenant"]])


async def _offsets(request: Any) -> Need:
    """A group's offsets or leases: its ingest drivers, or a reader of every tenant (without a group: only that)."""
    group = request.query_params.get("group")
    return Need("reader", tenants=(ALL,), alternatives=(ingest(group),) if group else ())


OPEN = _const(None)
RULES: dict[str, Rule] = {
    # Liveness, readiness and metrics stay open for probes and Prometheus (DESIGN 9.6 says what they reveal).
    "GET /healthz": OPEN,
    "GET /readyz": OPEN,
    "GET /metrics": OPEN,
    "GET /": OPEN,  # a redirect to /ui, which is not open
    "GET /ui/login": OPEN,  # the login form; POST checks the token it is sent (sessions.py)
    "POST /ui/login": OPEN,
    "POST /ui/logout": OPEN,
    "GET /v1/openapi.json": _const(ANY_ROLE),
    # POST /v1/commands is decided by the command's kind and group (``command_need``), read from the body.
    "POST /v1/compaction/poll": _const(COMPACTOR),
    "GET /v1/compaction/jobs": _const(EVERY_TENANT),
    "GET /v1/restores": _const(EVERY_TENANT),
    "GET /v1/erasures": _const(EVERY_TENANT),  # positions and the key's SHA-256, never the key
    "POST /v1/raft/barrier": _const(PEER),
    "GET /v1/blocks": _tenants_in_query,
    "GET /v1/blocks/{block_id}": _const(SOME_READER),  # the block's own tenant is checked once it is found
    "GET /v1/tenants/{tenant}/blocks": _tenant_in_path,
    "GET /v1/tenants/{tenant}/generations": _tenant_in_path,
    "GET /v1/tenants/{tenant}/schemas": _tenant_in_path,
    "GET /v1/labels": _tenants_in_query,
    "GET /v1/labels/{name}/values": _tenants_in_query,
    "GET /v1/offsets": _offsets,
    "GET /v1/ingest/leases": _offsets,  # a group's drivers watch its leases; every lease needs a reader of all
    "GET /v1/tombstones": _const(EVERY_TENANT),
    "GET /v1/tenants": _const(SOME_READER),  # answered with the tenants the reader may see
    "GET /v1/status": _const(ANY_ROLE),
    "GET /v1/state-hash": _const(ADMIN),
    "GET /v1/snapshot": _const(ADMIN),
    "GET /ui": _const(EVERY_TENANT),
    "GET /v1/ui/status": _const(EVERY_TENANT),
}


def rule_for(method: str, path: str) -> Rule:
    """The rule of a route (its path template, e.g. ``/v1/tenants/{tenant}/blocks``); ``admin`` if it has none."""
    return RULES.get(f"{method} {path}", _const(ADMIN))


def visible_tenants(who: Principal, tenants: Sequence[str]) -> list[str]:
    if who.role in ("admin", "peer") or ALL in who.tenants:
        return list(tenants)
    return [t for t in tenants if t in who.tenants]


# -- tokens ---------------------------------------------------------------------------------------------------


def new_token() -> str:
    """A fresh API token: 256 random bits, with a prefix that secret scanners can recognise."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_from_header(authorization: str | None) -> str | None:
    """The token of ``Bearer <token>``. HTTP Basic is not accepted: a browser caches Basic credentials and attaches
    them to cross-site requests too (CSRF); the status page has a login form and a session cookie instead."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() or None
    return None


def load_tokens(path: Path) -> list[TokenEntry]:
    try:
        tree = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"metastore.tokens_file {path} does not exist; create it with `shale metastore token "
                          "create`") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"metastore.tokens_file {path} is not valid TOML: {exc}") from exc
    entries = []
    for i, raw in enumerate(tree.get("token", [])):
        try:
            entries.append(TokenEntry.model_validate(raw))
        except ValidationError as exc:
            problem = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'entry'}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"metastore.tokens_file {path}, token {i + 1}: {problem}") from None
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ConfigError(f"metastore.tokens_file {path}: token names must be unique (they name callers in logs)")
    return entries


def format_entry(entry: TokenEntry) -> str:
    """One ``[[token]]`` table in TOML (JSON strings are valid TOML basic strings)."""
    import json

    lines = ["[[token]]", f"name = {json.dumps(entry.name)}", f"role = {json.dumps(entry.role)}"]
    if entry.groups:
        lines.append(f"groups = {json.dumps(entry.groups)}")
    if entry.tenants:
        lines.append(f"tenants = {json.dumps(entry.tenants)}")
    lines.append(f"sha256 = {json.dumps(entry.sha256)}")
    return "\n".join(lines) + "\n"


def write_private(path: Path, text: str) -> None:
    """Create ``path`` readable by its owner only (0600), replacing it atomically if it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)


def read_token_file(path: Path, key: str) -> str:
    """A token kept in a file of its own: refused if other users may read it (they could have copied it)."""
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{key} {path} cannot be read: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{key} {path} is readable by other users; `chmod 600 {path}` (and issue a new token if "
                          "someone may have read it)")
    if not text:
        raise ConfigError(f"{key} {path} is empty")
    return text


def local_admin_token(data_dir: Path) -> tuple[Path, str]:
    """The single-node metastore's admin token in ``<data_dir>/admin.token`` (0600), created on first use. Only the
    user the metastore runs as can read it, and that user can change the state file directly anyway, so the token
    grants nothing more."""
    path = data_dir / LOCAL_ADMIN_TOKEN
    if not path.exists():
        write_private(path, new_token() + "\n")
    return path, read_token_file(path, "the local admin token")


TOKENS_RECHECK_SECONDS = 1.0
"""How often a node looks at its tokens file (on the first call after this long). A token added to the file is
accepted by a node at most this long after the file is in place on that node; clients ride out that window
(``client.TOKEN_PROPAGATION_SECONDS``)."""


@dataclass
class TokenTable:
    """Digests of the tokens this node accepts: the tokens file (re-read when it changes, so a token is revoked
    by deleting its entry; a file deleted, unreadable or invalid revokes every token it held, until it is valid
    again), a local admin token and the peer tokens derived from the cluster secrets."""

    tokens_file: Path | None
    fixed: list[tuple[bytes, Principal]] = field(default_factory=list)
    recheck_seconds: float = TOKENS_RECHECK_SECONDS
    _entries: list[tuple[bytes, Principal]] = field(default_factory=list)
    _stamp: tuple[int, int] | None = None
    _checked: float = float("-inf")
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._reload(initial=True)

    def add(self, token: str, who: Principal) -> None:
        self.fixed.append((bytes.fromhex(digest(token)), who))

    def _reload(self, initial: bool = False) -> None:
        if self.tokens_file is None:
            return
        try:
            st = self.tokens_file.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            entries = load_tokens(self.tokens_file)
        except (OSError, ConfigError) as exc:
            if initial:
                raise ConfigError(str(exc)) from None
            if self._entries or self._stamp is not None:  # fail closed, said loudly once per breakage
                log.error("TOKENS FILE DELETED, UNREADABLE OR INVALID: every token it listed is refused until it is "
                          "valid again (peer and local admin tokens still work)",
                          extra={"file": str(self.tokens_file), "error": str(exc)})
            self._entries = []
            self._stamp = None
            return
        self._entries = [(bytes.fromhex(e.sha256), Principal(e.name, e.role, frozenset(e.groups),
                                                             frozenset(e.tenants))) for e in entries]
        self._stamp = stamp
        if not initial:
            log.info("tokens file reloaded", extra={"tokens": len(entries), "file": str(self.tokens_file)})

    def __len__(self) -> int:
        return len(self._entries) + len(self.fixed)

    def authenticate(self, token: str) -> Principal | None:
        return self.authenticate_digest(hashlib.sha256(token.encode()).digest())

    def authenticate_digest(self, presented: bytes) -> Principal | None:
        """The caller whose token has this SHA-256 digest (a session keeps the digest, never the token)."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked >= self.recheck_seconds:
                self._checked = now
                self._reload()
            entries = self._entries + self.fixed
        found = None
        for known, who in entries:  # every entry is compared: no early exit
            if hmac.compare_digest(known, presented):
                found = who
        return found
