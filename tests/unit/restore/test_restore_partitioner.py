"""The target partition of a restored record: Kafka's Java default partitioner, byte for byte."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shale.restore import PartitionMapping, java_partition, murmur2

# Kafka's UtilsTest.testMurmur2 vectors, and more, checked against org.apache.kafka.common.utils.Utils.murmur2 of
# kafka-clients 4.1.1 (the jar in the development cache): (bytes, murmur2, toPositive(murmur2) % 7).
VECTORS = [
    (b"21", -973932308, 3),
    (b"foobar", -790332482, 0),
    (b"a-little-bit-long-string", -985981536, 1),
    (b"a-little-bit-longer-string", -1486304829, 0),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971, 3),
    (b"abc", 479470107, 4),
    (b"", 275646681, 2),
    (b"k1", 1684045097, 0),
    ("été".encode(), -2101193575, 4),
    (bytes([0xFF, 0x80, 0, 1, 2]), -1813786316, 3),
]


def test_murmur2_matches_kafka_java_client() -> None:
    for data, expected, partition in VECTORS:
        assert murmur2(data) == expected, data
        assert java_partition(data, 7) == partition, data


@given(st.binary(max_size=64), st.integers(1, 1000))
def test_a_keyed_record_lands_in_a_partition_of_the_target(key: bytes, partitions: int) -> None:
    assert -(1 << 31) <= murmur2(key) < (1 << 31)
    assert 0 <= java_partition(key, partitions) < partitions
    assert PartitionMapping(partitions + 1, partitions).target(0, key) == java_partition(key, partitions)


@given(st.integers(1, 64), st.integers(0, 63), st.one_of(st.none(), st.binary(max_size=16)))
def test_same_count_keeps_the_partition(count: int, source: int, key: bytes | None) -> None:
    source %= count
    assert PartitionMapping(count, count).target(source, key) == source


@given(st.integers(1, 64), st.integers(1, 64), st.integers(0, 63))
def test_a_record_without_key_keeps_its_source_partition_modulo_the_target_count(source_count: int, target: int,
                                                                                  source: int) -> None:
    source %= source_count
    assert PartitionMapping(source_count, target).target(source, None) == source % target
