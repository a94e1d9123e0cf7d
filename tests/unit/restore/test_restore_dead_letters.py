"""Dead-letter keys of a restore: named by source position (so a retried task writes the same object), parsed back
exactly, and refused for a job name that could escape its prefix."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shale.block.layout import parse_restore_dead_letter_key, restore_dead_letter_key
from shale.objstore import open_bucket_url
from shale.restore.offsets import dead_lettered

jobs = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)


@given(jobs, st.integers(0, 100_000), st.integers(0, 2**62))
def test_a_key_parses_back_to_its_position(job: str, partition: int, offset: int) -> None:
    key = restore_dead_letter_key("acme", job, partition, offset)
    assert key.startswith(f"acme/restore-dead-letters/{job}/")
    assert parse_restore_dead_letter_key(key) == (partition, offset)


@pytest.mark.parametrize("job", ["", "../x", "a/b", "x" * 65, "job name"])
def test_a_job_name_that_could_escape_is_refused(job: str) -> None:
    with pytest.raises(ValueError, match="restore job name"):
        restore_dead_letter_key("acme", job, 0, 0)


def test_the_job_s_dead_letters_are_listed_per_partition() -> None:
    bucket = open_bucket_url("memory://")
    for partition, offset in ((0, 5), (0, 9), (2, 1)):
        bucket.put(restore_dead_letter_key("acme", "job1", partition, offset), b"{}")
    bucket.put(restore_dead_letter_key("acme", "job2", 1, 1), b"{}")  # another job's
    assert dead_lettered(bucket, "acme", "job1") == {0: [5, 9], 2: [1]}
