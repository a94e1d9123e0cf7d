"""``shale dev up | down | status``: a local Kafka broker and a MinIO server that outlive the command.

The state (pids, ports, endpoint) is kept in ``<dir>/state.json`` so that ``status`` and ``down`` find the
processes again; every process runs in its own session, and ``down`` kills each whole process group.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from shale.dev.kafka import KafkaBroker
from shale.dev.minio import MinioServer
from shale.dev.process import pid_alive, port_open, stop_process_group

DEV_BUCKET = "shale"


@dataclass
class StackState:
    kafka_pid: int
    kafka_bootstrap: str
    minio_pid: int
    minio_endpoint: str
    bucket: str
    access_key: str
    secret_key: str

    def env(self) -> dict[str, str]:
        """Environment overrides that point a Shale process at this stack."""
        return {
            "SHALE_KAFKA__BOOTSTRAP_SERVERS": self.kafka_bootstrap,
            "SHALE_BUCKET__URL": f"s3://{self.bucket}",
            "SHALE_BUCKET__ENDPOINT": self.minio_endpoint,
            "SHALE_BUCKET__ACCESS_KEY_ID": self.access_key,
            "SHALE_BUCKET__SECRET_ACCESS_KEY": self.secret_key,
            "SHALE_BUCKET__ALLOW_HTTP": "true",
        }


class DevStack:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.state_file = directory / "state.json"

    def load(self) -> StackState | None:
        try:
            return StackState(**json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return None

    def up(self) -> StackState:
        """Start both services (or return the running ones). Idempotent."""
        state = self.load()
        if state is not None and all(self.status(state).values()):
            return state
        if state is not None:
            self.down()
        broker = KafkaBroker(self.directory / "kafka").start()
        try:
            minio = MinioServer(self.directory / "minio").start()
        except Exception:
            broker.stop()
            raise
        minio.create_bucket(DEV_BUCKET)
        assert broker.process is not None
        assert minio.process is not None
        state = StackState(broker.process.pid, broker.bootstrap_servers, minio.process.pid, minio.endpoint,
                           DEV_BUCKET, minio.access_key, minio.secret_key)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(asdict(state), indent=2))
        return state

    def status(self, state: StackState | None = None) -> dict[str, bool]:
        state = state or self.load()
        if state is None:
            return {"kafka": False, "minio": False}
        kafka_port = int(state.kafka_bootstrap.rsplit(":", 1)[1])
        minio_port = int(state.minio_endpoint.rsplit(":", 1)[1])
        return {
            "kafka": pid_alive(state.kafka_pid) and port_open(kafka_port),
            "minio": pid_alive(state.minio_pid) and port_open(minio_port),
        }

    def down(self) -> list[str]:
        """Stop every process this stack started; return the names of those that were running."""
        state = self.load()
        stopped: list[str] = []
        if state is None:
            return stopped
        for name, pid in (("kafka", state.kafka_pid), ("minio", state.minio_pid)):
            if pid_alive(pid):
                stop_process_group(pid)
                stopped.append(name)
        self.state_file.unlink(missing_ok=True)
        return stopped
