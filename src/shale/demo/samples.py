"""The demo's data: 2,000-line samples of six real system logs from Loghub (see loghub/README.md and
loghub/LICENSE: free for research use; cite the Loghub paper; keep the notice)."""

from __future__ import annotations

from pathlib import Path

LOGHUB = Path(__file__).resolve().parent / "loghub"

# Sample file -> the text parser preset that reads it.
LOGHUB_FORMATS = {
    "Apache": "apache",
    "HDFS": "hdfs",
    "OpenSSH": "openssh",
    "Spark": "spark",
    "Zookeeper": "zookeeper",
    "Linux": "linux",
}


def loghub_lines(name: str) -> list[bytes]:
    """The lines of one sample (without line ends), as Kafka record values."""
    return [line.rstrip(b"\r\n") for line in (LOGHUB / f"{name}_2k.log").read_bytes().splitlines()]
