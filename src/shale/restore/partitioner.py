"""Where a restored record goes in the target topic.

The same partition as in the source when the target has as many partitions (the default); otherwise the partition
Kafka's Java producer would choose for the record's key: ``toPositive(murmur2(key)) % n`` (its default
partitioner, and the one Kafka Streams and most Java clients rely on). librdkafka's own default is a different hash
(CRC32), so the restore computes the partition itself and names it on every record. A record without a key has no
hash: it keeps its source partition modulo ``n``, so the records of one source partition without a key stay
together and in order.
"""

from __future__ import annotations

from dataclasses import dataclass

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit MurmurHash2 of ``data`` with Kafka's seed."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = length % 4
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's Java producer picks for a keyed record: ``toPositive(murmur2(key)) % partitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True)
class PartitionMapping:
    """Source partition and key -> target partition."""

    source_partitions: int
    target_partitions: int

    @property
    def by_key(self) -> bool:
        return self.source_partitions != self.target_partitions

    def describe(self) -> str:
        if not self.by_key:
            return "same partition"
        return (f"by key hash into {self.target_partitions} partitions (Kafka's Java default partitioner: "
                f"murmur2(key) positive mod {self.target_partitions}); records without a key keep their source "
                f"partition mod {self.target_partitions}")

    def target(self, source_partition: int, key: bytes | None) -> int:
        if not self.by_key:
            return source_partition
        if key is None:
            return source_partition % self.target_partitions
        return java_partition(key, self.target_partitions)
