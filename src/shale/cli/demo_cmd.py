"""``shale demo``: the main pipeline on embedded defaults, with its own Kafka broker and MinIO server."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from shale.cli.common import shale_errors


@click.command()
@click.option("--records", default=10_000, show_default=True, help="How many records to produce.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where services keep their data (default: a temporary folder, removed afterwards).")
@shale_errors
def demo(records: int, workdir: Path | None) -> None:
    """Start Kafka and MinIO, run the pipeline through Spark, and print what it did."""
    from rich.console import Console

    from shale.config import BucketConfig, SparkConfig
    from shale.dev import KafkaBroker, MinioServer
    from shale.dev.smoke import run_smoke
    from shale.spark import spark_session

    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="shale-demo-") as tmp:
        root = workdir or Path(tmp)
        with console.status("starting Kafka (KRaft) ..."):
            broker = KafkaBroker(root / "kafka").start()
        console.print(f"kafka ready at {broker.bootstrap_servers}")
        try:
            with console.status("starting MinIO ..."):
                minio = MinioServer(root / "minio").start()
                minio.create_bucket("shale-demo")
            console.print(f"minio ready at {minio.endpoint}, bucket 'shale-demo'")
            try:
                bucket = BucketConfig(url="s3://shale-demo", endpoint=minio.endpoint, access_key_id=minio.access_key,
                                      secret_access_key=minio.secret_key, allow_http=True)
                with console.status("starting Spark ..."):
                    spark = spark_session("shale-demo", SparkConfig(master="local[2]"))
                with console.status(f"producing {records} records and running the Spark pipeline ..."):
                    result = run_smoke(spark, broker.bootstrap_servers, bucket, str(root / "checkpoints"), records)
                spark.stop()
            finally:
                minio.stop()
        finally:
            broker.stop()
    click.echo(f"topic {result.topic}: produced {result.produced} records to 3 partitions")
    click.echo(f"stored {result.stored} records in {result.objects} Parquet objects on MinIO")
    click.echo(f"missing {result.missing}, unexpected or duplicated {result.unexpected}, "
               f"in {result.seconds:.1f}s")
    if not result.ok:
        raise click.ClickException("the pipeline lost or duplicated records")
    click.echo("smoke pipeline OK")
