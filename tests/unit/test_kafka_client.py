"""The admin-client questions of the ingest job, against a scripted client: a retry sends a new request."""

from __future__ import annotations

import time
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from shale import kafka
from shale.config import KafkaConfig
from shale.errors import RetryableError

NOT_LEADER = KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, "not leader", retriable=True)
CONFIG = KafkaConfig(bootstrap_servers="127.0.0.1:1")


def _future(value: Any = None, error: KafkaError | None = None) -> Future[Any]:
    future: Future[Any] = Future()
    if error is not None:
        future.set_exception(KafkaException(error))
    else:
        future.set_result(value)
    return future


class ScriptedAdmin:
    """``list_offsets`` answers from a script: one entry per request, an offset or an error per partition."""

    def __init__(self, answers: list[int | KafkaError]) -> None:
        self.answers, self.requests = answers, 0

    def list_offsets(self, partitions: dict[Any, Any], **_: Any) -> dict[Any, Future[Any]]:
        answer = self.answers[self.requests]
        self.requests += 1
        return {tp: _future(error=answer) if isinstance(answer, KafkaError)
                else _future(SimpleNamespace(offset=answer + tp.partition)) for tp in partitions}


def test_a_moved_leader_is_asked_again_with_a_new_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "sleep", lambda _: None)
    client = ScriptedAdmin([NOT_LEADER, 10, NOT_LEADER, NOT_LEADER, 50])
    bounds = kafka.offset_bounds(CONFIG, [("t", 0), ("t", 1)], client=client)  # type: ignore[arg-type]
    assert bounds == {("t", 0): (10, 50), ("t", 1): (11, 51)}
    assert client.requests == 5


def test_offsets_give_up_with_a_retryable_error_after_five_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "sleep", lambda _: None)
    client = ScriptedAdmin([NOT_LEADER] * 5)
    with pytest.raises(RetryableError, match="the offsets of 1 partitions"):
        kafka.offset_bounds(CONFIG, [("t", 0)], client=client)  # type: ignore[arg-type]
    assert client.requests == 5


def test_a_final_error_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "sleep", lambda _: None)
    client = ScriptedAdmin([KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"), 0])
    with pytest.raises(RetryableError, match="denied"):
        kafka.offset_bounds(CONFIG, [("t", 0)], client=client)  # type: ignore[arg-type]
    assert client.requests == 1


class IdleAdmin(ScriptedAdmin):
    """Like confluent-kafka's clients, falsy while no request is in flight (``len()`` is its queue's length)."""

    def __len__(self) -> int:
        return 0

    def list_topics(self, **_: Any) -> Any:
        return SimpleNamespace(topics={})


def test_the_job_s_idle_admin_client_is_used_not_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new admin client per question (found by timing a plan: 62 ms for a description, 1 ms on the job's own
    client) cost every batch its connections; the given client is used even when it is falsy."""
    def no_new_client(_: KafkaConfig) -> Any:
        raise AssertionError("a new admin client was made although the job gave its own")

    monkeypatch.setattr(kafka, "admin", no_new_client)
    client = IdleAdmin([10, 50])
    assert not client
    assert kafka.offset_bounds(CONFIG, [("t", 0)], client=client) == {("t", 0): (10, 50)}  # type: ignore[arg-type]
    assert kafka.describe_topics(CONFIG, ["t"], client=client) == {}  # type: ignore[arg-type]
