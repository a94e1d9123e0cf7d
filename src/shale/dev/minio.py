"""A real MinIO server built with ``go install``, on a loopback port, with a bucket created."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from shale.dev.fetch import fetch_minio
from shale.errors import ServiceStartError
from shale.process import ManagedProcess, free_port

READY_TIMEOUT_S = 60.0
DEV_ACCESS_KEY = "shale-dev"
DEV_SECRET_KEY = "shale-dev-secret"  # noqa: S105 - a loopback development server's fixed credential
DEV_REGION = "us-east-1"


def _sign(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def s3_request(method: str, url: str, access_key: str, secret_key: str, region: str = DEV_REGION,
               body: bytes = b"") -> int:
    """Send one AWS Signature V4 signed request; return the HTTP status. Used to create buckets only."""
    parsed = urlparse(url)
    now = dt.datetime.now(dt.UTC)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload_hash = hashlib.sha256(body).hexdigest()
    headers = {"host": parsed.netloc, "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date}
    signed = ";".join(sorted(headers))
    canonical = "\n".join([
        method, parsed.path or "/", parsed.query,
        *(f"{k}:{headers[k]}" for k in sorted(headers)), "", signed, payload_hash,
    ])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _sign(_sign(_sign(_sign(f"AWS4{secret_key}".encode(), day), region), "s3"), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={signed}, Signature={signature}"
    )
    request = urllib.request.Request(url, data=body or None, method=method, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback URL we built
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@dataclass
class MinioServer:
    data_dir: Path
    port: int = 0
    access_key: str = DEV_ACCESS_KEY
    secret_key: str = DEV_SECRET_KEY
    process: ManagedProcess | None = None
    host: str = "127.0.0.1"
    """The S3 API's address (loopback unless a test's network namespaces must reach it); the console stays on
    loopback."""

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = READY_TIMEOUT_S) -> MinioServer:
        binary = fetch_minio()
        self.port = self.port or free_port(self.host)
        console_port = free_port()
        env = dict(os.environ, MINIO_ROOT_USER=self.access_key, MINIO_ROOT_PASSWORD=self.secret_key,
                   MINIO_BROWSER="off", MINIO_UPDATE="off")
        command = [str(binary), "server", "--quiet", "--address", f"{self.host}:{self.port}",
                   "--console-address", f"127.0.0.1:{console_port}", str(self.data_dir / "data")]
        self.process = ManagedProcess("minio", command, self.data_dir / "minio.log", env=env)
        self.process.start()
        self.process.wait_ready(self._ready, timeout, "ready (GET /minio/health/ready)")
        return self

    def _ready(self) -> bool:
        url = f"{self.endpoint}/minio/health/ready"
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback URL we built
            return bool(response.status == 200)

    def create_bucket(self, name: str) -> None:
        """Create ``name`` (an existing bucket owned by us is fine). MinIO can answer 503 for a few seconds after
        it reports ready, while it finishes initializing; that is retried."""
        deadline = time.monotonic() + 30
        while True:
            status = s3_request("PUT", f"{self.endpoint}/{name}", self.access_key, self.secret_key)
            if status in (200, 409):
                return
            if status < 500 or time.monotonic() > deadline:
                raise ServiceStartError(f"minio: creating bucket {name!r} failed with HTTP {status}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def kill9(self) -> None:
        if self.process is not None:
            self.process.kill9()
