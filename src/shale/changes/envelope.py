"""What one stored record means to a change table: a row (insert, update, snapshot read), a delete, a truncate of
the whole table, a record that is no change of any row (skipped), or a record whose meaning cannot be read
(withheld: its key is left out of the latest view, never shown older than it is).

Debezium's envelope (its documentation, "Data change events"): ``op`` is ``c`` (create), ``u`` (update), ``r``
(read, a snapshot row), ``d`` (delete: ``after`` null, ``before`` the deleted row), ``t`` (truncate: every row of
the table; no key) or ``m`` (a logical decoding message, no row); ``source.ts_ms`` is when the database made the
change. The JSON converter writes the envelope as it is, or with ``schemas.enable=true`` as ``{"schema": ...,
"payload": <envelope>}``; the Avro converter writes it as a record whose top-level fields the ``avro`` parser
keeps as columns (``op`` a string, ``source`` a struct). A delete is followed by a tombstone (the same key, a null
value) for Kafka's log compaction: it deletes again, harmlessly. Schema change events (the ``<prefix>`` topic:
``ddl``, ``tableChanges``), transaction markers (the ``<prefix>.transaction`` topic: ``status`` BEGIN or END) and
heartbeats (``ts_ms`` alone) carry no ``op``: they change no row, and are skipped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

Kind = Literal["row", "delete", "truncate", "skip", "withheld"]
ROW_OPS = frozenset({"c", "u", "r"})
"""Operations whose ``after`` is the row as it now is."""
NOT_CHANGES = (frozenset({"ddl"}), frozenset({"tableChanges"}), frozenset({"status", "id"}))
"""Keys of Debezium documents that are no row change: a schema change event, a transaction marker."""


@dataclass(frozen=True)
class Meaning:
    """One record's meaning: its kind, the source's time of the change (Debezium's ``source.ts_ms``; None when the
    record does not say) and, for a withheld record, why."""

    kind: Kind
    source_ms: int | None = None
    reason: str = ""


def _ms(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def of_op(op: Any, source: Any = None) -> Meaning:
    """The meaning of a Debezium ``op`` (a parser's column, or the decoded envelope's field) and its ``source``."""
    source_ms = _ms(source.get("ts_ms")) if isinstance(source, dict) else None
    if op in ROW_OPS:
        return Meaning("row", source_ms)
    if op == "d":
        return Meaning("delete", source_ms)
    if op == "t":
        return Meaning("truncate", source_ms)
    if op == "m":
        return Meaning("skip", source_ms)
    return Meaning("withheld", source_ms, f"Debezium op {op!r} is none of c, r, u, d, t, m")


def of_debezium_value(value: bytes | None) -> Meaning:
    """The meaning of a Debezium record from its value bytes: a tombstone (None) deletes; a JSON envelope (with or
    without ``schemas.enable``) is read by its ``op``; a JSON document without one that Debezium writes beside
    changes (a schema change, a transaction marker, a heartbeat) is skipped; anything else is withheld."""
    if value is None:
        return Meaning("delete")
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError:
        return Meaning("withheld", reason="the value is neither JSON nor a parsed Debezium envelope (an Avro "
                                          "envelope is read through the avro parser's op column)")
    if isinstance(document, dict) and isinstance(document.get("payload"), dict) and "schema" in document:
        document = document["payload"]  # the JSON converter with schemas.enable=true
    if not isinstance(document, dict):
        return Meaning("withheld", reason=f"the value is a JSON {type(document).__name__}, not an envelope")
    if "op" in document:
        return of_op(document["op"], document.get("source"))
    if any(keys <= document.keys() for keys in NOT_CHANGES) or set(document) <= {"ts_ms"}:
        return Meaning("skip")
    return Meaning("withheld", reason="the JSON value has no op: not a Debezium change event")
