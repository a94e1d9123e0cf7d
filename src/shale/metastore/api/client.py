"""``MetastoreClient``: the HTTP client. It finds and follows the leader, retries what is safe to retry and
gives up with ``MetastoreUnavailableError`` after its deadline.

Every command is idempotent (see rules/fsm.py), so a write whose answer was lost is simply sent again. Every call
carries the client's token; a refusal (401, 403) is an ``AccessDeniedError``, never retried, with one exception: a
401 that says the token is *unknown* to the node that answered, in the client's first
``TOKEN_PROPAGATION_SECONDS``, is tried on the other nodes and again until that window ends (a new token reaches
each node of a cluster on the node's own clock, at most ``auth.TOKENS_RECHECK_SECONDS`` after its tokens file
changes). With ``ca_file`` the client verifies HTTPS nodes against that CA bundle only.
"""

from __future__ import annotations

import logging
import random
import ssl
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from shale.block import BlockMeta
from shale.compaction import PollRequest, PollResponse
from shale.errors import (
    AccessDeniedError,
    CommandRejectedError,
    InvalidNameError,
    MetastoreUnavailableError,
    QueryTimeoutError,
)
from shale.index import IncarnationRow, LossRow, OffsetRow
from shale.metastore.api.reads import PAGE_LIMIT, RemoteReads
from shale.metastore.rules import Command, Result, encode

log = logging.getLogger(__name__)
TOKEN_PROPAGATION_SECONDS = 3.0
"""How long after it starts a client treats "unknown token" as "not known here yet": three times a node's
tokens-file recheck period (``auth.TOKENS_RECHECK_SECONDS``), so a token issued just before the client started
is accepted once every node has looked at its file. Later, an unknown token is a revoked one: refused at once."""


def tls_verify(ca_file: str) -> ssl.SSLContext | bool:
    """What httpx verifies HTTPS against: the given CA bundle only, or the system's CAs."""
    return ssl.create_default_context(cafile=ca_file) if ca_file else True


class MetastoreClient(RemoteReads):
    def __init__(self, addresses: Sequence[str], *, timeout: float = 10.0, deadline: float = 60.0,
                 command_format: str = "json", token: str = "", ca_file: str = "") -> None:
        if not addresses:
            raise ValueError("a metastore client needs at least one address")
        self.addresses = [a.rstrip("/") for a in addresses]
        self.deadline = deadline
        self.command_format = command_format
        self._leader: str | None = None
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(timeout=timeout, headers=headers, verify=tls_verify(ca_file))
        self._token_window_ends = time.monotonic() + TOKEN_PROPAGATION_SECONDS

    def close(self) -> None:
        self._http.close()

    def _order(self) -> list[str]:
        rest = [a for a in self.addresses if a != self._leader]
        random.shuffle(rest)
        return ([self._leader] if self._leader else []) + rest

    def _call(self, method: str, path: str, *, params: Any = None, content: bytes | None = None) -> httpx.Response:
        """Send to the leader if known, else to each node in turn; follow not-leader hints; back off and retry
        unavailable answers and connection errors until the deadline."""
        deadline = time.monotonic() + self.deadline
        attempt = 0
        last = "no node answered"
        while True:
            for address in self._order():
                try:
                    response = self._http.request(method, address + path, params=params, content=content,
                                                  headers={"content-type": _content_type(content)})
                except httpx.HTTPError as exc:
                    last = f"{address}: {type(exc).__name__}: {exc}"
                    if address == self._leader:
                        self._leader = None
                    continue
                if response.status_code == 503:
                    body = _json(response)
                    last = f"{address}: {body.get('message', response.text)}"
                    hint = body.get("leader")
                    if body.get("error") == "not_leader" and hint and hint.rstrip("/") != address:
                        self._leader = hint.rstrip("/")
                        if self._leader not in self.addresses:
                            self.addresses.append(self._leader)
                    continue
                if method == "POST" and response.status_code in (200, 409):
                    self._leader = address
                if self._not_known_yet(response):
                    last = f"{address}: the token is not known to this node yet"
                    continue
                _raise_refusal(response, method, path)
                return response
            attempt += 1
            if time.monotonic() >= deadline:
                raise MetastoreUnavailableError(
                    f"no metastore node could serve {method} {path} within {self.deadline:.0f}s "
                    f"(tried {', '.join(self.addresses)}); last answer: {last}")
            time.sleep(min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))

    def _not_known_yet(self, response: httpx.Response) -> bool:
        """A 401 for an unknown token within the client's propagation window (the token may be new)."""
        if response.status_code != 401 or time.monotonic() >= self._token_window_ends:
            return False
        return _json(response).get("reason") == "unknown_token"

    def get(self, path: str, **params: Any) -> Any:
        response = self._call("GET", path, params={k: v for k, v in params.items() if v is not None})
        if response.status_code == 400:
            raise InvalidNameError(_json(response).get("message", response.text))
        response.raise_for_status()
        return response.json()

    # -- writes, and the reads the routes do not derive from their declaration (reads.py) -------------

    def submit(self, command: Command) -> Result:
        response = self._call("POST", "/v1/commands", content=encode(command, self.command_format))
        if response.status_code == 400:
            body = _json(response)
            raise CommandRejectedError(body.get("message", response.text), reason=body.get("error", "malformed"))
        if response.status_code not in (200, 409):
            raise MetastoreUnavailableError(f"unexpected answer {response.status_code}: {response.text[:300]}")
        return Result.model_validate_json(response.content)

    def get_block(self, block_id: str) -> BlockMeta | None:
        response = self._call("GET", f"/v1/blocks/{block_id}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return BlockMeta.model_validate_json(response.content)

    def offsets(self, group: str | None = None, generation: int | None = None) -> list[OffsetRow]:
        body = self.get("/v1/offsets", group=group, generation=generation)
        return [OffsetRow.model_validate(o) for o in body["offsets"]]

    def offset_history(self, group: str | None = None,
                       generation: int | None = None) -> tuple[list[IncarnationRow], list[LossRow]]:
        body = self.get("/v1/offsets", group=group, generation=generation, history=True)
        return ([IncarnationRow.model_validate(i) for i in body["incarnations"]],
                [LossRow.model_validate(x) for x in body["losses"]])

    def tenants(self) -> list[str]:
        return list(self.get("/v1/tenants")["tenants"])

    def tenant_blocks(self, tenant: str, *, after: str = "", limit: int | None = None) -> list[BlockMeta]:
        """A tenant's blocks in id order, page by page (the server caps one answer): all of them, or the first
        ``limit`` with an id after ``after``."""
        blocks: list[BlockMeta] = []
        page: str | None = after
        while page is not None and (limit is None or len(blocks) < limit):
            body = self.get(f"/v1/tenants/{tenant}/blocks", after=page or None,
                            limit=None if limit is None else min(limit - len(blocks), PAGE_LIMIT))
            blocks += [BlockMeta.model_validate(b) for b in body["blocks"]]
            page = body.get("next")
        return blocks

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.get("/v1/status")
        return result

    def poll_compaction(self, request: PollRequest) -> PollResponse:
        response = self._call("POST", "/v1/compaction/poll", content=request.model_dump_json().encode())
        if response.status_code == 400:
            raise CommandRejectedError(_json(response).get("message", response.text), reason="malformed")
        if response.status_code >= 500:  # the poll may or may not have been applied: the worker sends it again
            raise MetastoreUnavailableError(f"compaction poll answered {response.status_code}: {response.text[:300]}")
        response.raise_for_status()
        return PollResponse.model_validate_json(response.content)

    def state_hash(self, address: str) -> dict[str, Any]:
        """One node's state hash (no leader following): for checking that replicas converged. Needs admin."""
        response = self._http.get(address.rstrip("/") + "/v1/state-hash")
        _raise_refusal(response, "GET", "/v1/state-hash")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def snapshot(self, out: Path) -> None:
        """Stream a consistent copy of the state into ``out`` (from the first node that answers). Needs admin."""
        last = "no node answered"
        for address in self._order():
            try:
                with self._http.stream("GET", address + "/v1/snapshot", timeout=300) as response:
                    _raise_refusal(response, "GET", "/v1/snapshot")
                    response.raise_for_status()
                    with open(out, "wb") as f:
                        for chunk in response.iter_bytes():
                            f.write(chunk)
                return
            except httpx.HTTPError as exc:
                last = f"{address}: {exc}"
        raise MetastoreUnavailableError(f"no metastore node sent a snapshot; last answer: {last}")


def _raise_refusal(response: httpx.Response, method: str, path: str) -> None:
    """Refusals that retrying cannot change: no valid token, the wrong role, an oversized body, a query that ran
    past its deadline."""
    code = response.status_code
    if code not in (401, 403, 413, 422):
        return
    if not response.is_stream_consumed:
        response.read()
    body = _json(response)
    message = str(body.get("message", response.text[:300]))
    if code in (401, 403):
        raise AccessDeniedError(f"the metastore refused {method} {path}: {message}", status=code)
    if code == 413:
        raise CommandRejectedError(message, reason="too-large")
    if body.get("error") == "query_timeout":
        raise QueryTimeoutError(message)


def _content_type(content: bytes | None) -> str:
    """JSON, or msgpack for a msgpack-encoded command (a map: first byte 0x80-0x8f, 0xde or 0xdf)."""
    if content and (0x80 <= content[0] <= 0x8F or content[0] in (0xDE, 0xDF)):
        return "application/msgpack"
    return "application/json"


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
