"""The compaction worker's loop against a real embedded metastore and an in-memory bucket. Merges run the Spark
task's own code in a thread of this process (``ThreadRunner``) instead of on Spark: the loop's logic is the same."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.factories import Clock, write_backup_block

from shale.block import BlockFetcher, BlockMeta, BlockState, block_file_key
from shale.compaction.messages import Assigned, PollRequest, PollResponse
from shale.compactor.merge import MergeResult
from shale.compactor.wire import MergeFailedError, decode_outcome, encode_job
from shale.compactor.worker import CompactionWorker, run_merge_share, spread
from shale.config import BucketConfig, CompactionConfig
from shale.errors import MetastoreUnavailableError
from shale.metastore import AddBlocks, MetastoreService, SingleNodeLog, StateMachine
from shale.objstore import open_bucket


class ThreadRunner:
    """A poll's jobs as one share, run by the task code itself (``run_merge_share``: each merge's input fetched
    while the merge before runs) in a thread of this process."""

    def __init__(self, bucket: BucketConfig) -> None:
        self.bucket = bucket
        self.pool = ThreadPoolExecutor(2)

    def start(self, jobs: list[Assigned]) -> list[Future[MergeResult]]:
        futures: list[Future[MergeResult]] = [Future() for _ in jobs]

        def run() -> None:
            results = run_merge_share([encode_job(job) for job in jobs], self.bucket)
            for future, result in zip(futures, results, strict=True):
                try:
                    future.set_result(decode_outcome(result))
                except MergeFailedError as exc:
                    future.set_exception(exc)

        self.pool.submit(run)
        return futures

    def cancel(self, job: str) -> None:
        pass

    def close(self) -> None:
        self.pool.shutdown()


class Flaky:
    """The real service behind a network that fails on demand: ``down`` polls are not applied at all;
    ``lose_answers`` polls are applied and then their answer is lost (a client timeout after the server
    applied), and ``refuse`` rewrites outcomes as a wrongly refused answer would."""

    def __init__(self, service: MetastoreService, clock: Clock) -> None:
        self.service = service
        self.clock = clock
        self.down = 0
        self.lose_answers = 0
        self.refuse = False
        self.polls: list[PollRequest] = []

    def poll_compaction(self, request: PollRequest) -> PollResponse:
        self.polls.append(request)
        if self.down:
            self.down -= 1
            raise MetastoreUnavailableError("no metastore node answered (test)")
        response = self.service.poll_compaction(request)
        if self.lose_answers:
            self.lose_answers -= 1
            raise MetastoreUnavailableError("read timeout (test)")
        if self.refuse:
            return response.model_copy(update={"updates": dict.fromkeys(response.updates, "unknown-job")})
        return response

    def get_block(self, block_id: str) -> BlockMeta | None:
        if self.down:
            raise MetastoreUnavailableError("no metastore node answered (test)")
        return self.service.get_block(block_id)


@pytest.fixture
def bucket() -> BucketConfig:
    return BucketConfig(url=f"memory://worker-{uuid.uuid4().hex}")


@pytest.fixture
def flaky(tmp_path: Path, bucket: BucketConfig) -> Flaky:
    clock = Clock()
    state = StateMachine(tmp_path / "s.db")
    service = MetastoreService(state, SingleNodeLog(state, clock=clock), clock=clock,
                               compaction=CompactionConfig(blocks_per_job=[3]))
    store = open_bucket(bucket)
    service.submit(AddBlocks(blocks=[write_backup_block(store, "acme", "app", 0, i * 10, 10) for i in range(6)]))
    return Flaky(service, clock)


def _worker(flaky: Flaky, bucket: BucketConfig) -> CompactionWorker:
    return CompactionWorker(flaky, bucket, None, slots=2, poll_interval=0.01, runner=ThreadRunner(bucket))


def _until_merged(worker: CompactionWorker) -> None:
    for running in worker.running.values():
        running.future.result(timeout=60)


def _marked(bucket: BucketConfig) -> set[str]:
    views = BlockFetcher(open_bucket(bucket), 0).sync("acme").blocks.values()
    return {v.id for v in views if v.state is BlockState.MARKED_FOR_DELETION}


def _offsets(flaky: Flaky) -> list[int]:
    return sorted(o for m in flaky.service.query_blocks(["acme"], 0, 2**62) for r in m.kafka
                  for o in range(r.start, r.end))


def test_a_success_report_whose_answer_was_lost_completes_and_nothing_is_marked(flaky: Flaky,
                                                                                 bucket: BucketConfig) -> None:
    worker = _worker(flaky, bucket)
    assert worker.step() is not None
    assert len(worker.running) == 2
    _until_merged(worker)
    flaky.lose_answers = 1  # the report is applied; its answer never arrives
    assert worker.step() is None
    assert worker.unanswered is not None
    response = worker.step()  # sent again, unchanged
    assert response is not None
    assert flaky.polls[-1] == flaky.polls[-2]
    assert set(response.updates.values()) == {"completed"}
    assert len(worker.completed) == 2
    assert _marked(bucket) == set()
    assert {m.level for m in flaky.service.query_blocks(["acme"], 0, 2**62)} == {1}
    assert _offsets(flaky) == list(range(60))


def test_a_worker_never_marks_an_output_the_index_holds(flaky: Flaky, bucket: BucketConfig) -> None:
    worker = _worker(flaky, bucket)
    worker.step()
    _until_merged(worker)
    flaky.refuse = True  # applied, but answered as refused (a wrong answer must not delete committed data)
    worker.step()
    assert worker.running == {}
    indexed = {m.id for m in flaky.service.query_blocks(["acme"], 0, 2**62)}
    assert {r.output.id for r in worker.completed} == set()
    assert len(indexed) == 2
    assert _marked(bucket) == set()


def test_an_output_refused_for_real_is_marked(flaky: Flaky, bucket: BucketConfig) -> None:
    worker = _worker(flaky, bucket)
    worker.step()
    _until_merged(worker)
    flaky.clock.now += 16  # both leases expire; another worker takes the jobs over
    taken = flaky.service.poll_compaction(PollRequest(worker="w2", capacity=2)).assigned
    assert {a.job for a in taken} == set(worker.running)
    response = worker.step()
    assert response is not None
    assert set(response.updates.values()) == {"lost"}
    assert worker.running == {}  # the worker stopped both jobs
    marked = _marked(bucket)
    assert len(marked) == 2
    assert all(flaky.service.get_block(b) is None for b in marked)


def test_the_worker_rides_out_an_outage_longer_than_its_client_deadline(flaky: Flaky, bucket: BucketConfig) -> None:
    worker = _worker(flaky, bucket)
    worker.step()
    assert len(worker.running) == 2
    flaky.down = 5  # five polls in a row get no answer: each one a client giving up after its deadline
    stop = threading.Event()
    runner = threading.Thread(target=worker.run, args=(stop, True))
    runner.start()
    runner.join(timeout=120)
    assert not runner.is_alive()
    assert flaky.down == 0
    assert all(p == flaky.polls[1] for p in flaky.polls[1:7])  # the unanswered poll, sent again unchanged
    assert flaky.polls[7].request != flaky.polls[1].request
    assert len(worker.completed) == 2
    assert {m.level for m in flaky.service.query_blocks(["acme"], 0, 2**62)} == {1}
    assert _offsets(flaky) == list(range(60))
    assert _marked(bucket) == set()


def test_a_failing_merge_fails_only_its_own_job(flaky: Flaky, bucket: BucketConfig) -> None:
    """The jobs of one poll share a Spark job: a merge that raises (here: a source object cut short) is that job's
    error, returned by its task, and the other job of the poll completes."""
    first = min(flaky.service.query_blocks(["acme"], 0, 2**62), key=lambda m: m.kafka[0].start)
    store = open_bucket(bucket)
    key = block_file_key(first, first.files[0].name)
    store.put(key, store.get(key)[:100])
    worker = _worker(flaky, bucket)
    assert worker.step() is not None
    assert len(worker.running) == 2
    _until_merged_or_failed(worker)
    (bad,) = [r for r in worker.running.values() if r.future.exception() is not None]
    assert "CorruptObjectError" in str(bad.future.exception())
    response = worker.step()
    assert response is not None
    assert list(response.updates.values()) == ["completed"]
    assert len(worker.completed) == 1
    assert bad.job.job not in worker.running  # abandoned: its lease runs out and the scheduler hands it out again


def _until_merged_or_failed(worker: CompactionWorker) -> None:
    for running in worker.running.values():
        running.future.exception(timeout=60)


def test_jobs_are_spread_over_tasks_by_input_bytes(bucket: BucketConfig) -> None:
    """A poll's jobs run as one Spark job of one task per core: each task gets about the same input bytes, every
    job exactly once, in the order given."""
    store = open_bucket(bucket)
    sizes = [5, 1, 1, 1, 1, 1, 3]
    jobs = [Assigned(job=f"j{i}", token=1, lease_expires_at=0, tenant="acme", shard=0, level=0, group="backup",
                     generation=1, sources=[write_backup_block(store, "acme", "app", 0, i * 1000, 100 * n)])
            for i, n in enumerate(sizes)]
    shares = spread(jobs, 2)
    assert sorted(p for share in shares for p in share) == list(range(len(jobs)))
    assert all(share == sorted(share) for share in shares)
    weight = [sum(jobs[p].sources[0].size for p in share) for share in shares]
    assert max(weight) - min(weight) <= max(j.sources[0].size for j in jobs[1:6])
    assert spread(jobs[:1], 4) == [[0]]
