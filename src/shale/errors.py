"""The errors Shale raises, in one small tree.

Every error message says what is wrong and what to do next. Callers decide by class, never by text:
a ``RetryableError`` may succeed if the same call is made again later (the store or the metastore was
briefly unreachable, the leader changed); anything else will fail the same way until something changes.

::

    ShaleError
    ├── ConfigError                 bad configuration: names the key, the value and what is allowed
    ├── InvalidNameError            a tenant, topic, dataset or label name outside the allowed syntax
    ├── NotFoundError               an object, block or job that does not exist
    ├── ArchivedObjectError         an object in an archive storage class: restore it in the store first
    ├── ConflictError               a put-if-absent or conditional update lost against another writer
    ├── CorruptObjectError          an object that exists but fails validation (names the block/object)
    ├── CommandRejectedError        the metastore refused a command (offset gap, stale fencing token, ...)
    ├── AccessDeniedError           the metastore refused the caller: no valid token (401) or the wrong role (403)
    ├── QueryTimeoutError           a metastore query ran past metastore.query_timeout
    ├── ServiceStartError           a service process (metastore node, Kafka, MinIO, Spark) did not start
    └── RetryableError              try again later
        ├── StoreUnavailableError   the object store answered 5xx or timed out
        ├── MetastoreUnavailableError
        └── NotLeaderError          this metastore node is not the leader (carries the leader's address)
"""

from __future__ import annotations


class ShaleError(Exception):
    """Base class of every error Shale raises on purpose."""


class ConfigError(ShaleError):
    """The configuration is invalid. The message names the key, the bad value and what is allowed."""


class InvalidNameError(ShaleError, ValueError):
    """A name (tenant, topic, dataset, label) is not allowed; it is never used as a path."""


class NotFoundError(ShaleError):
    """The named object, block, job or record does not exist."""


class ArchivedObjectError(ShaleError):
    """The object exists but sits in an archive storage class (S3 Glacier Flexible Retrieval, Deep Archive) and
    must be restored in the store before it can be read. Never taken for a missing object: nothing is judged
    partial or deleted because of it."""


class ConflictError(ShaleError):
    """A conditional write lost: the object exists already, or changed since it was read."""


class CorruptObjectError(ShaleError):
    """An object exists but cannot be trusted: malformed, unknown version, or a checksum mismatch."""

    def __init__(self, message: str, *, key: str = "", block_id: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.block_id = block_id


class CommandRejectedError(ShaleError):
    """The metastore's state machine refused a command. ``reason`` is a stable machine-readable code."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class AccessDeniedError(ShaleError):
    """The metastore refused the caller. ``status`` is 401 (no valid token) or 403 (the token's role or scope does
    not allow the call; the message names the role or tenant needed)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class QueryTimeoutError(ShaleError):
    """A query ran past its deadline and was stopped. Narrow it (time range, tenants, selector) and ask again."""


class IncompatibleColumnError(ShaleError):
    """Blocks of one table hold a column under types that cannot be read as one (a schema changed
    incompatibly): named, never cast into a wrong value."""


class ServiceStartError(ShaleError):
    """A service did not start. The message names the service, the command and the tail of its log."""


class RetryableError(ShaleError):
    """A transient failure: the same call may succeed later."""


class StoreUnavailableError(RetryableError):
    """The object store did not answer, or answered with a server error, after the retries."""


class MetastoreUnavailableError(RetryableError):
    """No metastore node answered, or none of them is the leader right now."""


class NotLeaderError(RetryableError):
    """This metastore node is not the leader. ``leader`` is the leader's HTTP address when known."""

    def __init__(self, message: str, *, leader: str | None = None) -> None:
        super().__init__(message)
        self.leader = leader
