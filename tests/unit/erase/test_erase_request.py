"""An erasure's request (DESIGN 19.1): the watermarks bound each topic incarnation on its own (a recreated topic's
older records are all of the request), and the same request made again once the first is past ``requested`` is a
new erasure with its own watermarks, while a run killed before its plan is resumed. Against a real embedded
metastore and an in-memory bucket; Kafka's answer (``high_watermarks``) is given."""

from __future__ import annotations

import base64
import hashlib
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tests.factories import BASE_MS, Clock
from tests.unit.erase.test_erase import ERASED, _rows, _worker

from shale.block import BlockMeta, BlockSpec, DatasetInput, KafkaRange, deterministic_block_id, write_block
from shale.block.schemas import BACKUP_SCHEMA
from shale.config import BucketConfig, KafkaConfig
from shale.erase import ErasureRequest, erase, erasure_status
from shale.erase import api as erase_api
from shale.erase.receipt import final_scan
from shale.errors import CommandRejectedError
from shale.metastore import (
    AddBlocks,
    ErasureWatermark,
    MetastoreService,
    RequestErasure,
    SingleNodeLog,
    StateMachine,
    Watermarks,
)
from shale.objstore import Bucket, open_bucket

OLD, NEW = "A" * 22, "B" * 22
"""The topic's incarnation before it was deleted and recreated, and after."""
KAFKA = KafkaConfig(bootstrap_servers="127.0.0.1:1")


def _backup(bucket: Bucket, start: int, count: int, incarnation: str, seed: str = "") -> BlockMeta:
    """A level-0 backup block of app[0], offsets ``[start, start+count)`` of ``incarnation`` (the key at every
    offset that is 3 modulo 7)."""
    spec = BlockSpec(id=deterministic_block_id(BASE_MS + start * 1000, f"{incarnation}/{start}/{seed}"),
                     tenant="acme", group="backup",
                     kafka=[KafkaRange(topic="app", partition=0, start=start, end=start + count,
                                       incarnation=incarnation)])
    table = pa.table(_rows("app", 0, start, count), schema=BACKUP_SCHEMA)
    return write_block(bucket, spec, [DatasetInput("records", "app", table, "timestamp", labels=[{"topic": "app"}])])


def _keyed(start: int, count: int) -> list[int]:
    return [o for o in range(start, start + count) if o % 7 == 3]


@pytest.fixture
def bucket() -> BucketConfig:
    return BucketConfig(url=f"memory://erase-request-{uuid.uuid4().hex}")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(tmp_path: Path, clock: Clock) -> MetastoreService:
    state = StateMachine(tmp_path / "s.db")
    return MetastoreService(state, SingleNodeLog(state, clock=clock), clock=clock)


@pytest.fixture
def kafka_ends(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[int, str]]:
    """What Kafka answers for app[0]: (end, incarnation), set by each test."""
    now: dict[str, tuple[int, str]] = {}
    monkeypatch.setattr(erase_api, "high_watermarks", lambda kafka, topics: [
        ErasureWatermark(topic="app", partition=0, end=now["app"][0], incarnation=now["app"][1])])
    return now


# --- 1. a recreated topic -----------------------------------------------------------------------------------------

def test_an_older_incarnations_records_past_the_new_ones_end_are_erased(
        service: MetastoreService, bucket: BucketConfig, kafka_ends: dict[str, tuple[int, str]]) -> None:
    """The topic held 40 records (incarnation OLD), was deleted and recreated (NEW) and holds 10 again: the
    request's watermark is NEW's end, 10. OLD's records of the key at offsets 10 and past (17, 24, 31, 38) were
    produced before the request too; they were skipped as "produced later" and stayed, with matches 0 for them."""
    store = open_bucket(bucket)
    service.submit(AddBlocks(blocks=[_backup(store, 0, 40, OLD), _backup(store, 0, 12, NEW)]))
    kafka_ends["app"] = (10, NEW)  # NEW's offsets 10 and 11 were produced after the request
    report = erase(service, bucket, ErasureRequest("acme", ERASED, topics=["app"]), kafka=KAFKA, dry_run=False)
    assert report.watermarks == [{"topic": "app", "partition": 0, "end": 10, "incarnation": NEW, "older": False},
                                 {"topic": "app", "partition": 0, "end": 40, "incarnation": OLD, "older": True}]
    found = {(r["incarnation"], r["offset"]) for r in report.records}
    assert found == {(OLD, o) for o in _keyed(0, 40)} | {(NEW, 3)}  # NEW's 10 is past its end: new data
    _worker(service, bucket).run(until_idle=True)
    assert erasure_status(service, report.id).state == "rewritten"
    left = {(r.incarnation, o) for b in service.tenant_blocks("acme") for r in b.kafka
            for o in _stored_keyed(store, b)}
    assert left == {(NEW, 10)}


def _stored_keyed(store: Bucket, block: BlockMeta) -> list[int]:
    from shale.block import read_dataset

    return [o for d in block.datasets for o, k in zip(
        read_dataset(store, block, d).column("offset").to_pylist(),
        read_dataset(store, block, d).column("key").to_pylist(), strict=True) if k == ERASED]


def test_a_row_of_unknown_incarnation_past_the_end_is_reported_not_erased(
        service: MetastoreService, bucket: BucketConfig, kafka_ends: dict[str, tuple[int, str]]) -> None:
    """A block written before incarnations were recorded ('') cannot say whose its offset 17 is: a position of
    any incarnation would also erase NEW's offset 17 when it is produced, another key's record. It is kept and
    named in the report."""
    store = open_bucket(bucket)
    service.submit(AddBlocks(blocks=[_backup(store, 0, 20, "")]))
    kafka_ends["app"] = (10, NEW)
    report = erase(service, bucket, ErasureRequest("acme", ERASED, topics=["app"]), kafka=KAFKA, dry_run=True)
    assert [r["offset"] for r in report.records] == [3]
    assert [u["offset"] for u in report.undecided] == [10, 17]


def test_the_receipts_final_scan_finds_an_older_incarnations_record_past_the_new_end(bucket: BucketConfig) -> None:
    """The receipt's final scan applies the same rule: a record of the key left in OLD at offset 17 is found,
    not skipped as produced after NEW's end (10)."""
    store = open_bucket(bucket)
    left = [_backup(store, 0, 20, OLD), _backup(store, 0, 12, NEW)]
    marks = Watermarks([ErasureWatermark(topic="app", partition=0, end=10, incarnation=NEW)])
    scan = final_scan(store, left, ["app"], hashlib.sha256(ERASED).hexdigest(), [], marks)
    assert sorted((m["block"], m["offset"]) for m in scan.matches) == sorted(
        [(left[0].id, o) for o in (3, 10, 17)] + [(left[1].id, 3)])


@given(offset=st.integers(0, 30), incarnation=st.sampled_from(["", OLD, NEW]),
       marked=st.sampled_from(["", NEW]), end=st.integers(0, 30))
@example(offset=20, incarnation=OLD, marked=NEW, end=10)  # an older incarnation's record: of the request
def test_a_watermark_bounds_its_own_incarnation_and_a_legacy_one_every_incarnation(
        offset: int, incarnation: str, marked: str, end: int) -> None:
    """``marked`` '': a watermark a previous release committed (no incarnation): it bounds every record, as then."""
    marks = Watermarks([ErasureWatermark(topic="app", partition=0, end=end, incarnation=marked).model_dump()])
    later = marks.produced_later("app", 0, offset, incarnation)
    assert later == (offset >= end and (marked == "" or incarnation in ("", marked)))
    assert not marks.produced_later("app", 1, offset, incarnation)  # a partition Kafka did not have: every record
    assert marks.undecided("app", 0, offset, incarnation) == (later and incarnation == "" and marked != "")


def test_a_request_committed_without_incarnations_is_still_read(service: MetastoreService) -> None:
    """The previous release's log entry and row: watermarks without incarnation."""
    request = ErasureRequest("acme", ERASED, topics=["app"])
    legacy = request.legacy_id_at(0)  # named by the key, as the previous release did
    entry = {"kind": "RequestErasure", "id": legacy, "tenant": "acme", "topics": ["app"],
             "key": base64.b64encode(ERASED).decode(), "watermarks": [{"topic": "app", "partition": 0, "end": 5}]}
    service.submit(RequestErasure.model_validate(entry)).raise_for_rejection()
    assert service.erasures(legacy)[0]["watermarks"] == [{"topic": "app", "partition": 0, "end": 5,
                                                          "incarnation": "", "older": False}]
    assert service.erasures(legacy)[0]["key_sha256"] == request.key_sha256
    assert erasure_status(service, legacy).unnamed == "older"


def _previous_rule(marks: list[dict[str, object]], partition: int, offset: int, incarnation: str) -> bool:
    """``Watermarks.produced_later`` as the previous release had it (its requests name Kafka's incarnation only)."""
    ends = {str(m["incarnation"]): int(str(m["end"])) for m in marks if m["partition"] == partition}
    if not ends:
        return False
    if "" in ends:
        return offset >= ends[""]
    if incarnation:
        return incarnation in ends and offset >= ends[incarnation]
    return offset >= max(ends.values())


@given(marks=st.lists(st.fixed_dictionaries({"topic": st.just("app"), "partition": st.integers(0, 1),
                                             "end": st.integers(0, 30),
                                             "incarnation": st.sampled_from(["", OLD, NEW])}), max_size=4),
       partition=st.integers(0, 1), offset=st.integers(0, 30), incarnation=st.sampled_from(["", OLD, NEW]))
@example(marks=[{"topic": "app", "partition": 0, "end": 10, "incarnation": NEW}], partition=0, offset=20,
         incarnation=OLD)  # an older incarnation's record: of the request, as then
def test_a_request_of_the_previous_release_is_read_as_it_was(marks: list[dict[str, object]], partition: int,
                                                             offset: int, incarnation: str) -> None:
    """Its stored form (a bare list of watermarks) keeps its meaning: an incarnation or a partition it does not
    name is the request's (``unnamed`` older), whatever requests of this release do."""
    unique = list({(m["partition"], m["incarnation"]): m for m in marks}.values())
    read = Watermarks(unique)
    assert read.unnamed == "older"
    assert read.stored() == [m | {"older": False} for m in unique]
    assert read.produced_later("app", partition, offset, incarnation) == _previous_rule(unique, partition, offset,
                                                                                      incarnation)


@st.composite
def _histories(draw: st.DrawFn) -> dict[str, object]:
    """A topic's history around a request, per partition (0, 1): older incarnations (all produced before),
    the current one (Kafka's end at the request, and records produced after), one created after the request
    (maybe); and how far the index had ingested each incarnation when the request was made (a lag)."""
    olds = ["O" * 21 + str(i) for i in range(draw(st.integers(0, 2)))]
    made: dict[tuple[str, int], tuple[int, int]] = {}  # (incarnation, partition) -> (produced before, after)
    indexed: dict[tuple[str, int], int] = {}
    for partition in (0, 1):
        for inc in olds:
            made[(inc, partition)] = (draw(st.integers(0, 6)), 0)
        made[(OLD, partition)] = (draw(st.integers(0, 6)), draw(st.integers(0, 6)))
        made[(NEW, partition)] = (0, draw(st.integers(0, 6)))
        for inc in [*olds, OLD]:
            indexed[(inc, partition)] = draw(st.integers(0, made[(inc, partition)][0]))
    return {"made": made, "indexed": indexed}


@given(history=_histories(), with_kafka=st.booleans())
@example(history={"made": {(OLD, 0): (0, 0), (NEW, 0): (0, 1), (OLD, 1): (0, 0), (NEW, 1): (0, 0)},
                  "indexed": {(OLD, 0): 0, (OLD, 1): 0}}, with_kafka=True)  # recreated after the request
@example(history={"made": {(OLD, 0): (0, 1), (NEW, 0): (0, 0), (OLD, 1): (0, 0), (NEW, 1): (0, 0)},
                  "indexed": {(OLD, 0): 0, (OLD, 1): 0}}, with_kafka=False)  # no Kafka, nothing indexed
def test_a_request_names_every_incarnation_it_knew_and_nothing_after_it_is_its(history: dict[str, Any],
                                                                              with_kafka: bool) -> None:
    """``request_watermarks`` from the index's blocks (their ranges) and Kafka's answer (the current incarnation,
    OLD here): with Kafka, exactly the records produced before the request are its own, whatever the index had
    ingested of them, but for an older incarnation of which the index held nothing (the request cannot know it:
    its records are taken as newer, erasure.md 19.1); without, exactly the records the index held. A topic
    recreated after it (NEW) is new data."""
    made, indexed = history["made"], history["indexed"]
    blocks = [BlockMeta.model_construct(kafka=[KafkaRange(topic="app", partition=p, start=0, end=end,
                                                          incarnation=inc)])
              for (inc, p), end in indexed.items() if end]
    kafka = [ErasureWatermark(topic="app", partition=p, end=made[(OLD, p)][0], incarnation=OLD) for p in (0, 1)]
    marks = Watermarks(erase_api.request_watermarks(blocks, ["app"], kafka if with_kafka else None).stored())
    for (inc, p), (before, after) in made.items():
        for offset in range(before + after):
            known = inc == OLD or any(end for (i, _), end in indexed.items() if i == inc)
            own = offset < before and known if with_kafka else offset < indexed.get((inc, p), 0)
            assert marks.produced_later("app", p, offset, inc) == (not own), (inc, p, offset)


# --- 3. the same request made again -------------------------------------------------------------------------------

def test_the_same_request_made_again_after_the_first_is_a_new_erasure(
        service: MetastoreService, bucket: BucketConfig, kafka_ends: dict[str, tuple[int, str]]) -> None:
    """Records of the key produced after the first request's watermarks are erased by the same command run
    again: its own id and watermarks. The dry run scans instead of showing the first report."""
    store = open_bucket(bucket)
    service.submit(AddBlocks(blocks=[_backup(store, 0, 20, NEW)]))
    kafka_ends["app"] = (20, NEW)
    request = ErasureRequest("acme", ERASED, topics=["app"])
    first = erase(service, bucket, request, kafka=KAFKA, dry_run=False)
    assert first.id == request.id
    assert [r["offset"] for r in first.records] == _keyed(0, 20)
    _worker(service, bucket).run(until_idle=True)
    service.submit(AddBlocks(blocks=[_backup(store, 20, 20, NEW)]))  # produced and ingested since
    kafka_ends["app"] = (40, NEW)
    dry = erase(service, bucket, request, kafka=KAFKA, dry_run=True)
    assert not dry.replay
    assert dry.previous == first.id != dry.id
    assert [r["offset"] for r in dry.records] == _keyed(20, 20)
    second = erase(service, bucket, request, kafka=KAFKA, dry_run=False)
    assert (second.id, second.previous, second.records) == (dry.id, first.id, dry.records)
    assert second.watermarks == [{"topic": "app", "partition": 0, "end": 40, "incarnation": NEW, "older": False}]
    _worker(service, bucket).run(until_idle=True)
    assert erasure_status(service, second.id).state == "rewritten"
    assert erasure_status(service, first.id).matches == len(_keyed(0, 20))  # the first is what it was
    assert not [o for b in service.tenant_blocks("acme") for o in _stored_keyed(store, b)]


@pytest.mark.parametrize("legacy", [False, True])
def test_a_request_killed_before_its_plan_is_resumed_with_its_own_watermarks(
        service: MetastoreService, bucket: BucketConfig, kafka_ends: dict[str, tuple[int, str]], legacy: bool) -> None:
    """``legacy``: the request was made by the previous release (named by the key, carrying it) and killed before
    its plan; this release resumes it under that name, so it never stays requested."""
    store = open_bucket(bucket)
    service.submit(AddBlocks(blocks=[_backup(store, 0, 20, NEW)]))
    request = ErasureRequest("acme", ERASED, topics=["app"])
    marks = [ErasureWatermark(topic="app", partition=0, end=11, incarnation=NEW)]
    named = request.legacy_id_at(0) if legacy else request.id
    what = {"key": base64.b64encode(ERASED).decode()} if legacy else {"key_sha256": request.key_sha256}
    service.submit(RequestErasure(id=named, tenant="acme", topics=["app"], watermarks=marks,
                                  **what)).raise_for_rejection()
    kafka_ends["app"] = (20, NEW)  # Kafka is further now: the recorded watermarks stand
    for dry_run in (True, False):
        report = erase(service, bucket, request, kafka=KAFKA, dry_run=dry_run)
        assert (report.id, report.previous) == (named, "")
        assert [r["offset"] for r in report.records] == [3, 10]
    assert erasure_status(service, named).state == "rewriting"


def test_no_command_an_erasure_by_key_sends_holds_the_key(service: MetastoreService, bucket: BucketConfig) -> None:
    """The metastore's Raft log keeps its entries until the next snapshot: a request names the key by its SHA-256
    only (before 2026-12-04 every request's entry carried the key, base64)."""
    store = open_bucket(bucket)
    service.submit(AddBlocks(blocks=[_backup(store, 0, 20, NEW)]))
    sent: list[bytes] = []
    submit = service.submit

    def recorded(command: Any) -> Any:
        sent.append(command.model_dump_json().encode())
        return submit(command)

    service.submit = recorded  # type: ignore[method-assign]
    report = erase(service, bucket, ErasureRequest("acme", ERASED, topics=["app"]), dry_run=False)
    assert report.records
    assert sent
    assert not [c for c in sent if ERASED in c or base64.b64encode(ERASED) in c]
    assert service.erasures(report.id)[0]["key_sha256"] == hashlib.sha256(ERASED).hexdigest()


def test_a_round_is_requested_once_and_only_after_the_one_before(service: MetastoreService) -> None:
    request = ErasureRequest("acme", ERASED, topics=["app"])

    def command(round_: int) -> RequestErasure:
        return RequestErasure(id=request.id_at(round_), round=round_, tenant="acme", topics=["app"],
                              key_sha256=request.key_sha256)

    with pytest.raises(CommandRejectedError, match="not requested"):
        service.submit(command(1)).raise_for_rejection()
    assert not service.submit(command(0)).raise_for_rejection().data["replay"]
    assert service.submit(command(0)).data["replay"]  # the same command twice: one request
    with pytest.raises(CommandRejectedError, match="still requested"):
        service.submit(command(1)).raise_for_rejection()
    wrong = command(2).model_copy(update={"round": 1})
    with pytest.raises(CommandRejectedError, match="does not name"):
        service.submit(wrong).raise_for_rejection()
    assert len({request.id_at(r) for r in range(50)}) == 50
    both = command(0).model_copy(update={"key": base64.b64encode(ERASED).decode()})
    with pytest.raises(CommandRejectedError, match="not both"):
        service.submit(both).raise_for_rejection()
