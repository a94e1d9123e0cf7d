"""What crosses the Spark boundary between the compaction worker and its merge tasks, encoded and decoded here
alone, one function per direction.

Into a task: the jobs of its share, each an ``Assigned`` as JSON. Out of it: one outcome per job, as JSON: the
merge's ``MergeResult``, or the error that stopped it (a merge that raises returns its error, so the other jobs of
the Spark job go on). Only strings cross, so Spark pickles nothing of Shale's but the bucket configuration.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import TypeAdapter

from shale.compaction import Assigned
from shale.compactor.merge import MergeResult

ERROR_CHARS = 2000
"""An error's message is cut to this length: it goes into a log line and a Spark result."""


class MergeFailedError(Exception):
    """A merge raised in its task; the message is the task's error."""


@dataclass(frozen=True)
class MergeFailure:
    """A merge that raised: its exception's type and message."""

    error: str


@dataclass(frozen=True)
class _Outcome:
    result: MergeResult | None = None
    failure: MergeFailure | None = None


_OUTCOME = TypeAdapter(_Outcome)


def encode_job(job: Assigned) -> str:
    return job.model_dump_json()


def decode_job(payload: str) -> Assigned:
    return Assigned.model_validate_json(payload)


def encode_result(result: MergeResult) -> str:
    return _OUTCOME.dump_json(_Outcome(result=result)).decode()


def encode_failure(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"[:ERROR_CHARS]
    return _OUTCOME.dump_json(_Outcome(failure=MergeFailure(text))).decode()


def decode_outcome(text: str) -> MergeResult:
    """A task's outcome: the merge's result, or ``MergeFailedError`` if its merge raised."""
    outcome = _OUTCOME.validate_json(text)
    if outcome.result is None:
        raise MergeFailedError(outcome.failure.error if outcome.failure is not None else "no outcome")
    return outcome.result
