"""The API's OpenAPI schema, served at ``GET /v1/openapi.json`` to any authenticated caller (it names routes and
body types, nothing about the data). FastAPI derives the routes and their parameters; the two routes that read
their body themselves (commands, compaction polls) get it from the same pydantic types the server decodes with,
every read derived from its declaration (``reads.served``) documents its answer, ``{key: value}``, from the read's
return type, and every operation lists the refusals every route may answer."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import TypeAdapter

from shale.compaction import PollRequest
from shale.metastore.api.reads import served_reads
from shale.metastore.rules import Command

REF = "#/components/schemas/{model}"
_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"},
                                                                   "message": {"type": "string"}}}
REFUSALS = {
    "400": "a malformed request (the message says what is wrong)",
    "401": "no valid token",
    "403": "the token's role or scope does not allow the call, or a cross-site request",
    "413": "body over metastore.max_request_bytes",
    "415": "a state-changing request that is not JSON",
    "503": "this node cannot serve the call now (not_leader names the leader)",
}
NOT_JSON = {"/v1/snapshot": "application/octet-stream", "/healthz": "text/plain", "/readyz": "text/plain",
            "/metrics": "text/plain", "/ui": "text/html"}
"""The routes whose successful answer is not JSON, and its media type."""
BODIES: dict[str, Any] = {"/v1/commands": TypeAdapter(Command), "/v1/compaction/poll": TypeAdapter(PollRequest)}


def schema(app: FastAPI) -> dict[str, Any]:
    """The schema of ``app``, built once and kept on it."""
    if app.openapi_schema:
        return app.openapi_schema
    document = app.openapi()
    components = document.setdefault("components", {})
    shared = components.setdefault("schemas", {})
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, adapter in BODIES.items():
        body = adapter.json_schema(ref_template=REF)
        shared.update(body.pop("$defs", {}))
        document["paths"][path]["post"]["requestBody"] = {
            "required": True, "content": {"application/json": {"schema": body}}}
    answers: dict[str, dict[str, Any]] = {}
    for read in served_reads():
        assert read.route is not None
        value = _plain_tuples(read.answer.json_schema(mode="serialization", ref_template=REF))
        shared.update(value.pop("$defs", {}))
        answers.setdefault(read.route.path, {})[read.route.key] = value
    for path, keys in answers.items():
        document["paths"][path]["get"]["responses"]["200"] = {"description": "the answer", "content": {
            "application/json": {"schema": {"type": "object", "required": list(keys), "properties": keys}}}}
    shared["Error"] = _ERROR
    for path, operations in document["paths"].items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            for status, why in REFUSALS.items():
                responses.setdefault(status, {"description": why, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Error"}}}})
            if path in NOT_JSON:
                responses["200"] = {"description": "the answer", "content": {NOT_JSON[path]: {"schema": {}}}}
                if path == "/readyz":
                    responses["503"] = {"description": "not ready", "content": {"text/plain": {"schema": {}}}}
            if path == "/v1/blocks/{block_id}":
                responses["404"] = {"description": "no such block among the tenants the token may read",
                                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            if path == "/v1/commands":
                responses["400"] = {"description": "malformed or not a client command", "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
                responses["409"] = {"description": "rejected by the state machine (its Result)",
                                    "content": {"application/json": {"schema": {"type": "object"}}}}
            operation["security"] = [] if path in ("/healthz", "/readyz", "/metrics") else [{"bearer": []}]
    app.openapi_schema = document
    return document


def _plain_tuples(schema: Any) -> Any:
    """``schema`` with each tuple (JSON Schema's ``prefixItems``, which the OpenAPI tools read as the older
    ``items`` list) as an array of its length."""
    if isinstance(schema, list):
        return [_plain_tuples(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "prefixItems" in schema:
        return {k: v for k, v in schema.items() if k != "prefixItems"}
    return {k: _plain_tuples(v) for k, v in schema.items()}
