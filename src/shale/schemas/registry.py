"""A Schema Registry client for its Confluent-compatible API, with a per-process cache of schemas by id.

A schema id names one immutable schema, so a cached schema never goes stale: each executor process asks the
registry once per id (``GET /schemas/ids/{id}``). A Protobuf schema may import files registered under other
subjects (its ``references``); those are read once per (subject, version), which are immutable too.

Errors, by what they mean for the record (``ShaleError`` > ``NotFoundError`` > ``UnknownSchemaError``;
``ShaleError`` > ``RetryableError`` > ``RegistryUnavailableError``):

* ``UnknownSchemaError``: the registry itself answered that the schema does not exist: HTTP 404 with the
  Confluent-compatible API's JSON error body and its own "not found" code (``error_code`` 40403 for a schema id;
  40401 or 40402 for a subject or a version of one). Only then can the record never be read with it: it is
  quarantined with the reason. Confluent Schema Registry and Apicurio's ``/apis/ccompat/v7`` both answer so;
* ``RegistryUnavailableError`` (retryable): everything else that is not a schema: no answer, a timeout, a 404
  without that code (a proxy's error page while the registry restarts, a url without ``/apis/ccompat/v7``), 401/403,
  5xx, a body that is not the registry's JSON. The record is fine, the registry (or its address) is not: nothing
  is quarantined, an ingest task pauses the partition (``shale.ingest.task.Paused``) and the driver plans it again
  later, with a backoff. The message names the URL asked (never a secret: the configuration refuses a url holding
  credentials) and what to check.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from shale.config import SchemaRegistryConfig
from shale.errors import NotFoundError, RetryableError

SCHEMA_NOT_FOUND = 40403
"""The Confluent-compatible API's ``error_code`` for a schema id it does not have."""
SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
"""Its codes for a subject it does not have, and for a version a subject does not have."""
BY_ID = frozenset({SCHEMA_NOT_FOUND})
BY_VERSION = frozenset({SUBJECT_NOT_FOUND, VERSION_NOT_FOUND})


class UnknownSchemaError(NotFoundError, LookupError):
    """The registry itself says this schema (id, or subject and version) does not exist."""


class RegistryUnavailableError(RetryableError):
    """The registry did not answer usefully; try again later. The message names the registry, never a secret;
    ``registry`` is its URL (which the configuration refuses to hold credentials)."""

    def __init__(self, message: str, *, registry: str = "") -> None:
        super().__init__(message)
        self.registry = registry


@dataclass(frozen=True)
class SchemaReference:
    """A file a schema imports (``name``, as the import statement spells it) registered as ``subject`` ``version``."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class RegisteredSchema:
    id: int
    schema_type: str
    """AVRO, PROTOBUF or JSON."""
    text: str
    references: tuple[SchemaReference, ...] = ()


_CACHE: dict[tuple[str, int], RegisteredSchema] = {}
_VERSIONS: dict[tuple[str, str, int], RegisteredSchema] = {}
_LOCK = threading.Lock()


class RegistryClient:
    """Reads schemas by id; thread-safe; the cache is shared by every client of the process (keyed by URL)."""

    def __init__(self, config: SchemaRegistryConfig) -> None:
        if not config.url:
            raise RegistryUnavailableError("no schema registry is configured: set ingest.schema_registry.url")
        self.url = config.url
        self._config = config

    def _client(self) -> httpx.Client:
        config = self._config
        auth = (config.username, config.password.get_secret_value()) if config.username else None
        verify: Any = config.ca_file or True
        return httpx.Client(auth=auth, verify=verify, timeout=config.timeout,
                            headers={"Accept": "application/vnd.schemaregistry.v1+json, application/json"})

    def cached(self, schema_id: int) -> RegisteredSchema | None:
        with _LOCK:
            return _CACHE.get((self.url, schema_id))

    def remember(self, schema: RegisteredSchema) -> None:
        """Put a schema into the process's cache as if the registry had answered it (schemas known in advance,
        and unit tests that need no registry)."""
        with _LOCK:
            _CACHE[(self.url, schema.id)] = schema

    def remember_reference(self, reference: SchemaReference, schema: RegisteredSchema) -> None:
        """Put a referenced schema into the cache (as ``remember``)."""
        with _LOCK:
            _VERSIONS[(self.url, reference.subject, reference.version)] = schema

    def schema(self, schema_id: int) -> RegisteredSchema:
        """The schema registered under ``schema_id`` (from the cache when this process has read it before)."""
        found = self.cached(schema_id)
        if found is not None:
            return found
        found = self._read(f"/schemas/ids/{schema_id}", f"schema id {schema_id}", schema_id, BY_ID)
        with _LOCK:
            _CACHE[(self.url, schema_id)] = found
        return found

    def referenced(self, reference: SchemaReference) -> RegisteredSchema:
        """The schema a reference names (``GET /subjects/{subject}/versions/{version}``), cached."""
        key = (self.url, reference.subject, reference.version)
        with _LOCK:
            found = _VERSIONS.get(key)
        if found is not None:
            return found
        what = f"subject {reference.subject!r} version {reference.version}"
        found = self._read(f"/subjects/{quote(reference.subject, safe='')}/versions/{reference.version}", what, 0)
        with _LOCK:
            _VERSIONS[key] = found
        return found

    def version(self, subject: str, version: int | str) -> RegisteredSchema:
        """The schema registered as ``subject`` ``version`` (a number, or ``latest``), with its id
        (``GET /subjects/{subject}/versions/{version}``); not cached, since ``latest`` moves."""
        what = f"subject {subject!r} version {version}"
        return self._read(f"/subjects/{quote(subject, safe='')}/versions/{quote(str(version), safe='')}", what, 0)

    def versions(self, subject: str) -> list[int]:
        """The versions registered under ``subject`` (``GET /subjects/{subject}/versions``), oldest first;
        ``UnknownSchemaError`` when the registry says the subject does not exist."""
        path = f"/subjects/{quote(subject, safe='')}/versions"
        response = self._get(path, f"subject {subject!r}", BY_VERSION)
        try:
            found = response.json()
            if not isinstance(found, list):
                raise TypeError(found)
            return sorted(int(v) for v in found)
        except (ValueError, TypeError):
            raise self._unavailable(f"answered GET {self.url}{path} with something that is not a list of versions",
                                    "check that ingest.schema_registry.url is the base of the Confluent-compatible "
                                    "API, not another service") from None

    def _read(self, path: str, what: str, schema_id: int, not_found: frozenset[int] = BY_VERSION) -> RegisteredSchema:
        """``path``'s schema; ``UnknownSchemaError`` only on the registry's own "not found" (an ``error_code`` of
        ``not_found``), ``RegistryUnavailableError`` on any other answer that is not a schema."""
        url = f"{self.url}{path}"
        response = self._get(path, what, not_found)
        try:
            body = response.json()
            references = tuple(SchemaReference(str(r["name"]), str(r["subject"]), int(r["version"]))
                               for r in body.get("references") or [])
            text = body["schema"]
            if not isinstance(text, str):
                raise TypeError(text)
            return RegisteredSchema(schema_id or int(body.get("id") or 0), str(body.get("schemaType") or "AVRO"),
                                    text, references)
        except (ValueError, KeyError, AttributeError, TypeError):
            raise self._unavailable(f"answered GET {url} with something that is not a schema",
                                    "check that ingest.schema_registry.url is the base of the Confluent-compatible "
                                    "API, not another service") from None

    def _get(self, path: str, what: str, not_found: frozenset[int]) -> httpx.Response:
        """The registry's 200 answer to ``GET path``; ``UnknownSchemaError`` only on the registry's own "not found"
        (an ``error_code`` of ``not_found``), ``RegistryUnavailableError`` on any other answer."""
        url = f"{self.url}{path}"
        try:
            with self._client() as client:
                response = client.get(url)
        except httpx.HTTPError as exc:
            raise self._unavailable(f"did not answer GET {url} ({type(exc).__name__})",
                                    "check that the registry runs and that the url's host and port are its own"
                                    ) from None
        code = _error_code(response)
        if response.status_code == 404 and code in not_found:
            raise UnknownSchemaError(f"{what} does not exist in the schema registry (error {code})")
        if response.status_code == 404:
            raise self._unavailable(
                f"answered HTTP 404 to GET {url} without the registry's own \"not found\" error code (so it is not "
                "the registry saying the schema does not exist: a proxy's error page, or a wrong path)",
                "check that ingest.schema_registry.url is the base of the Confluent-compatible API (Confluent: "
                "http://host:8081; Apicurio: http://host:8080/apis/ccompat/v7)")
        if response.status_code in (401, 403):
            raise self._unavailable(f"refused GET {url} (HTTP {response.status_code})",
                                    "check ingest.schema_registry.username and password")
        if response.status_code != 200:
            raise self._unavailable(f"answered HTTP {response.status_code} to GET {url}",
                                    "check the registry's health and its log")
        return response

    def _unavailable(self, happened: str, check: str) -> RegistryUnavailableError:
        return RegistryUnavailableError(f"schema registry {self.url} {happened} ({check})", registry=self.url)


def _error_code(response: httpx.Response) -> int | None:
    """The Confluent-compatible API's ``error_code`` in a JSON error body, or None when the body is not one."""
    try:
        body = response.json()
    except ValueError:
        return None
    code = body.get("error_code") if isinstance(body, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


@dataclass(frozen=True)
class KnownSchemas:
    """Schemas a driver read once, handed typed to its executors, which remember them in their processes' caches
    (``remember``): their tasks never ask the registry for them."""

    schemas: tuple[RegisteredSchema, ...] = ()
    references: tuple[tuple[SchemaReference, RegisteredSchema], ...] = ()

    def remember(self, client: RegistryClient) -> None:
        for schema in self.schemas:
            client.remember(schema)
        for reference, referenced in self.references:
            client.remember_reference(reference, referenced)


def with_references(client: RegistryClient, schema: RegisteredSchema) -> KnownSchemas:
    """``schema`` and the schemas it references, recursively (each read once)."""
    found: dict[SchemaReference, RegisteredSchema] = {}
    pending = list(schema.references)
    while pending:
        reference = pending.pop()
        if reference not in found:
            found[reference] = client.referenced(reference)
            pending.extend(found[reference].references)
    return KnownSchemas((schema,), tuple(found.items()))


def forget_cache() -> None:
    """Empty the process's cache (tests)."""
    with _LOCK:
        _CACHE.clear()
        _VERSIONS.clear()
