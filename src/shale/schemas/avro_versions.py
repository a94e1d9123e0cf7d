"""The columns of a chunk of several Avro versions of one record type, and the reader schema each writer version is
read with, so that a record's value lands in the column of its WRITER's field name whatever versions its chunk
holds (docs/design/schemas.md, "Avro versions: the writer's field names").

The columns are every top-level field name the chunk's versions declare, each typed by the newest (highest id)
version declaring it: the newest version's fields first, in its order, then the names only older versions declare,
newest first. A writer version is read with ITS OWN field names, each typed as its column (``reader_for``); Avro's
resolution then turns the writer's value into that type, which ``shale.schemas.avro`` does only where the meaning is
kept (a promotion checked exact, a logical type kept, an enum symbol not replaced). A column the writer does not
declare is null in its records: a field added later is null, not its default (the default would again depend on the
chunk: a record alone in a chunk of its own version has no such field); a field renamed with ``aliases`` keeps the
records of each name in that name's column; a field removed later keeps its values.

Inside a top-level field, Avro's resolution still decides: a nested record's fields are those of the newest
definition of its full name in the chunk (a nested field added with a default gets it, one removed is dropped, one
renamed with aliases fills the newest name). Every named type has one definition in the reader: the newest of the
chunk, since one Avro schema cannot define a name twice.
"""

from __future__ import annotations

import collections
import json
from typing import Any

__all__ = ["columns_schema", "reader_for", "renames", "same", "tree"]

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAMED = ("record", "error", "enum", "fixed")


def _full(schema: dict[str, Any], namespace: str) -> str:
    name = str(schema["name"])
    if "." in name:
        return name
    space = schema.get("namespace", namespace)
    return f"{space}.{name}" if space else name


def tree(schema: Any) -> Any:
    """``schema`` with every named type's name fully qualified (no ``namespace`` keys) and every reference to a
    named type replaced by its definition, so that a field's type can be moved into another schema on its own. A
    reference to a type still being defined (a recursive schema) stays its full name (it has no Arrow type)."""
    defined: dict[str, Any] = {}

    def walk(node: Any, namespace: str, open_: frozenset[str]) -> Any:
        if isinstance(node, list):
            return [walk(b, namespace, open_) for b in node]
        if isinstance(node, str):
            if node in _PRIMITIVES:
                return node
            for key in (f"{namespace}.{node}" if namespace and "." not in node else node, node):
                if key in defined and key not in open_:
                    return defined[key]
                if key in open_:
                    return key
            return node  # unknown: left for the compiler to name
        if not isinstance(node, dict):
            return node
        kind = node.get("type")
        if kind in _NAMED and "name" in node:
            full = _full(node, namespace)
            own = full.rpartition(".")[0]
            out = {k: v for k, v in node.items() if k != "namespace"}
            out["name"] = full
            if isinstance(node.get("aliases"), list):
                out["aliases"] = [a if "." in str(a) or not own else f"{own}.{a}" for a in node["aliases"]]
            if kind in ("record", "error"):
                out["fields"] = [{**f, "type": walk(f["type"], own, open_ | {full})} if isinstance(f, dict)
                                 and "type" in f else f for f in node.get("fields", [])]
            defined[full] = out
            return out
        out = dict(node)
        if isinstance(kind, dict | list) or (isinstance(kind, str) and kind not in _PRIMITIVES
                                               and kind not in ("array", "map")):
            out["type"] = walk(kind, namespace, open_)
        if kind == "array" and "items" in node:
            out["items"] = walk(node["items"], namespace, open_)
        if kind == "map" and "values" in node:
            out["values"] = walk(node["values"], namespace, open_)
        return out

    return walk(schema, "", frozenset())


def _named(node: Any, found: dict[str, Any]) -> None:
    """Every named type defined in ``node`` (a ``tree``), by full name, into ``found`` (the first kept)."""
    if isinstance(node, list):
        for branch in node:
            _named(branch, found)
    elif isinstance(node, dict):
        if node.get("type") in _NAMED and "name" in node:
            found.setdefault(str(node["name"]), node)
        for key in ("type", "items", "values"):
            _named(node.get(key), found)
        for field in node.get("fields", []) if node.get("type") in ("record", "error") else []:
            if isinstance(field, dict):
                _named(field.get("type"), found)


def _newest(node: Any, newest: dict[str, Any], open_: frozenset[str] = frozenset()) -> Any:
    """``node`` with each named type replaced by its newest definition in the chunk (``newest``)."""
    if isinstance(node, list):
        return [_newest(b, newest, open_) for b in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") in _NAMED and "name" in node:
        name = str(node["name"])
        if name in open_:
            return name
        node = newest.get(name, node)
        open_ = open_ | {name}
        if node.get("type") in ("record", "error"):
            return {**node, "fields": [{**f, "type": _newest(f["type"], newest, open_)} if isinstance(f, dict)
                                       and "type" in f else f for f in node.get("fields", [])]}
        return node
    out = dict(node)
    for key in ("type", "items", "values"):
        if key in node and not isinstance(node[key], str):
            out[key] = _newest(node[key], newest, open_)
    return out


def _once(node: Any, seen: set[str]) -> Any:
    """``node`` with every named type defined at its first place only (later ones its full name), as one Avro
    schema must be."""
    if isinstance(node, list):
        return [_once(b, seen) for b in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") in _NAMED and "name" in node:
        name = str(node["name"])
        if name in seen:
            return name
        seen.add(name)
        if node.get("type") in ("record", "error"):
            return {**node, "fields": [{**f, "type": _once(f["type"], seen)} if isinstance(f, dict) and "type" in f
                                       else f for f in node.get("fields", [])]}
        return node
    out = dict(node)
    for key in ("type", "items", "values"):
        if key in node and not isinstance(node[key], str):
            out[key] = _once(node[key], seen)
    return out


def _fields(schema: Any) -> list[dict[str, Any]]:
    fields = schema.get("fields") if isinstance(schema, dict) else None
    return [f for f in fields if isinstance(f, dict) and "name" in f] if isinstance(fields, list) else []


def columns_schema(versions: dict[int, Any]) -> dict[str, Any]:
    """The chunk's columns (see the module) as one Avro record schema of its newest version's name: ``versions``
    are the chunk's schemas of one record type by id, each a ``tree``."""
    newest_first = sorted(versions, reverse=True)
    named: dict[str, Any] = {}
    for sid in newest_first:
        _named(versions[sid], named)
    columns: dict[str, dict[str, Any]] = {}
    for sid in newest_first:
        for field in _fields(versions[sid]):
            columns.setdefault(str(field["name"]), {"name": field["name"], "type": field["type"]})
    top = versions[newest_first[0]]
    fields = [{**f, "type": _newest(f["type"], named, frozenset({str(top.get("name"))}))} for f in columns.values()]
    return {"type": "record", "name": top.get("name", "Record"), "fields": fields}


def reader_for(columns: dict[str, Any], writer: Any) -> dict[str, Any]:
    """The reader schema a record of ``writer`` (a ``tree``) is resolved into: the writer's own field names, in its
    order, each typed as its column in ``columns`` (a ``columns_schema``), named like the writer's record so that
    Avro's resolution matches it; a schema Avro can parse (each named type defined once)."""
    typed = {str(f["name"]): f["type"] for f in _fields(columns)}
    fields = [{"name": f["name"], "type": typed.get(str(f["name"]), f["type"])} for f in _fields(writer)]
    name = str(writer.get("name", "Record")) if isinstance(writer, dict) else "Record"
    return {"type": "record", "name": name, "fields": _once(fields, {name})}


def same(writer: Any, reader: dict[str, Any]) -> bool:
    """Whether ``reader`` (a ``reader_for``) types every field as ``writer`` itself does: its records are then read
    as their own schema, with no resolution at all."""
    own = reader_for({"fields": _fields(writer)}, writer)
    return json.dumps(own, sort_keys=True) == json.dumps(reader, sort_keys=True)


def renames(versions: dict[int, Any]) -> tuple[str, ...]:
    """Each top-level field a version renamed with ``aliases`` from a name other versions of ``versions`` (schema
    id -> ``tree``) declare, as text: "'temp_c' in schema ids 1, 2; 'temp_dc' (aliases 'temp_c') in schema id 3"."""
    declared: dict[str, list[int]] = collections.defaultdict(list)
    for sid in sorted(versions):
        for field in _fields(versions[sid]):
            declared[str(field["name"])].append(sid)
    out = []
    for sid in sorted(versions):
        for field in _fields(versions[sid]):
            name = str(field["name"])
            old = [str(a) for a in field.get("aliases") or [] if str(a) in declared and str(a) != name
                   and sid not in declared[str(a)]]
            if old and declared[name][0] == sid:
                out.append("; ".join([*(f"{a!r} in schema id{_s(declared[a])} {_ids(declared[a])}" for a in old),
                                      f"{name!r} (aliases {', '.join(map(repr, old))}) in schema id"
                                      f"{_s(declared[name])} {_ids(declared[name])}"]))
    return tuple(out)


def _s(ids: list[int]) -> str:
    return "s" if len(ids) > 1 else ""


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids))
