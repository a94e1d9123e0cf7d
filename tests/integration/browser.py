"""Headless Chromium driven over the DevTools protocol (a WebSocket, spoken here with the standard library): the
status page is opened the way an operator opens it, by typing a token into its login form, and never with the
token on a command line or in a URL."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import httpx
from tests.waiting import eventually

CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--remote-debugging-port=0"]


class _WebSocket:
    """A WebSocket client of text frames, enough for the DevTools protocol on loopback."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=120)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {parts.path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\nUpgrade: websocket"
                           f"\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           ).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head[:200]

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "the browser closed its DevTools connection"
            data += chunk
        return data

    def send(self, text: str) -> None:
        payload = text.encode()
        n = len(payload)
        header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
                                  if n < 65536 else bytes([0x80 | 127]) + n.to_bytes(8, "big"))
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def recv(self) -> str:
        message = b""
        while True:
            first, second = self._read(2)
            n = second & 0x7F
            if n == 126:
                n = int.from_bytes(self._read(2), "big")
            elif n == 127:
                n = int.from_bytes(self._read(8), "big")
            payload = self._read(n)
            if first & 0x0F in (0x9, 0xA):  # ping, pong: not part of a message
                continue
            message += payload
            if first & 0x80:
                return message.decode()

    def close(self) -> None:
        self.sock.close()


class Browser:
    """One headless Chromium with one page; ``call`` sends a DevTools command and returns its result."""

    def __init__(self, profile: Path, *flags: str) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen([*CHROMIUM, *flags, f"--user-data-dir={profile}", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        def opened() -> bool:
            assert self.process.poll() is None, "chromium exited at start"
            return port_file.exists() and bool(port_file.read_text().strip())

        eventually(opened, 60, "chromium to open its DevTools port")
        port = int(port_file.read_text().split()[0])
        pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=30).json() if t["type"] == "page"]
        self.ws = _WebSocket(pages[0]["webSocketDebuggerUrl"])
        self._id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            answer = json.loads(self.ws.recv())
            if answer.get("id") == self._id:
                assert "error" not in answer, (method, answer["error"])
                result: dict[str, Any] = answer["result"]
                return result

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, path: str, timeout: float = 60) -> None:
        """Until the page at ``path`` has loaded."""
        eventually(lambda: self.evaluate("location.pathname + ' ' + document.readyState") == f"{path} complete",
                   timeout, lambda: f"the page to reach {path} (it is at {self.evaluate('location.href')})")

    def log_in(self, base_url: str, token: str) -> None:
        """Open ``/ui`` (sent on to the login form), type the token and submit, as an operator would."""
        self.call("Page.navigate", url=base_url.rstrip("/") + "/ui")
        self.wait_for("/ui/login")
        self.call("Runtime.evaluate", expression=f"document.getElementById('token').value = {json.dumps(token)};"
                                                 "document.getElementById('login').submit()")
        self.wait_for("/ui")

    def dom(self) -> str:
        return str(self.evaluate("document.documentElement.outerHTML"))

    def screenshot(self, target: Path, width: int = 1280, height: int = 2200) -> None:
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)
        target.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def cookies(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.call("Network.getCookies")["cookies"]
        return found

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.ws.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
