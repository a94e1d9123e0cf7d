"""A Schema Registry client for its Confluent-compatible API, with a per-process cache of schemas by id.

A schema id names one immutable schema, so a cached schema never goes stale: each executor process asks the
registry once per id (``GET /schemas/ids/{id}``). Errors, by what they mean for the record:

* ``UnknownSchemaError``: the registry answered that the id does not exist (404): the record can never be read
  with it, it is quarantined with the reason;
* ``RegistryUnavailableError`` (retryable): no answer, a timeout, 5xx, 401/403: the record is fine, the registry
  is not; nothing is quarantined, the caller fails the batch so it is retried later.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import httpx

from shale.config import SchemaRegistryConfig
from shale.errors import RetryableError


class UnknownSchemaError(LookupError):
    """The registry says this schema id does not exist."""


class RegistryUnavailableError(RetryableError):
    """The registry did not answer usefully; try again later. The message names the registry, never a secret."""


@dataclass(frozen=True)
class RegisteredSchema:
    id: int
    schema_type: str
    """AVRO, PROTOBUF or JSON."""
    text: str


_CACHE: dict[tuple[str, int], RegisteredSchema] = {}
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

    def schema(self, schema_id: int) -> RegisteredSchema:
        """The schema registered under ``schema_id`` (from the cache when this process has read it before)."""
        found = self.cached(schema_id)
        if found is not None:
            return found
        try:
            with self._client() as client:
                response = client.get(f"{self.url}/schemas/ids/{schema_id}")
        except httpx.HTTPError as exc:
            raise RegistryUnavailableError(f"schema registry {self.url} did not answer for schema id {schema_id}: "
                                           f"{type(exc).__name__}; the batch is retried") from None
        if response.status_code == 404:
            raise UnknownSchemaError(f"schema id {schema_id} does not exist in the schema registry")
        if response.status_code != 200:
            raise RegistryUnavailableError(f"schema registry {self.url} answered HTTP {response.status_code} for "
                                           f"schema id {schema_id}; the batch is retried")
        try:
            body = response.json()
            found = RegisteredSchema(schema_id, str(body.get("schemaType") or "AVRO"), str(body["schema"]))
        except (ValueError, KeyError, AttributeError):
            raise RegistryUnavailableError(f"schema registry {self.url} answered schema id {schema_id} with "
                                           "something that is not a schema; the batch is retried") from None
        with _LOCK:
            _CACHE[(self.url, schema_id)] = found
        return found


def forget_cache() -> None:
    """Empty the process's cache (tests)."""
    with _LOCK:
        _CACHE.clear()
