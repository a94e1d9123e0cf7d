"""The foundation's smoke test: real Kafka -> Spark's Kafka source -> Parquet via obstore -> MinIO, read back."""

from __future__ import annotations

from pathlib import Path

from shale.dev.smoke import run_smoke


def test_smoke_pipeline_stores_exactly_the_produced_records(kafka, minio_bucket, spark, tmp_path: Path) -> None:
    result = run_smoke(spark, kafka.bootstrap_servers, minio_bucket, str(tmp_path / "checkpoints"), count=10_000)
    assert result.produced == 10_000
    assert result.missing == 0
    assert result.unexpected == 0
    assert result.stored == 10_000
    assert result.objects >= 3  # one object per Kafka partition at least
