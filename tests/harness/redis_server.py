"""A real `redis-server` on a free loopback port, as pytest fixtures.

Owns the server process: starts Debian's `redis-server` (no persistence, loopback only), waits
until it answers PING, and kills it at teardown. Tests that need Redis to fail use
`private_redis_server`: `stop()` / `start()` bring the server back on the same port, so a client
built before the outage can show that it recovers; `pause()` / `resume()` freeze it instead. A
missing `redis-server` fails the test run; nothing is skipped for want of Redis.

Load with `pytest_plugins = ["tests.harness.redis_server"]` (root conftest or a test module).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REDIS_SERVER_BIN = "redis-server"
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
PING_TIMEOUT_S = 0.5
# A free port can be taken between our probe and redis binding it; pick another and try again.
MAX_START_ATTEMPTS = 5


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PING_TIMEOUT_S) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One `redis-server` process; `start()` again after `stop()` reuses the same port."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        binary = shutil.which(REDIS_SERVER_BIN)
        if binary is None:
            pytest.fail(
                "redis-server is not installed (apt-get install -y redis-server); Redis tests never skip",
                pytrace=False,
            )
        self._binary = binary
        self._workdir = workdir
        self._pinned_port = port
        self.port = port or 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        if self.running:
            return
        for _ in range(MAX_START_ATTEMPTS):
            port = self._pinned_port or self.port or free_loopback_port()
            if self._try_start(port):
                self.port = port
                # Once a port has worked, restarts use it: clients hold this URL.
                self._pinned_port = port
                return
            if self._pinned_port is None:
                self.port = 0
        log = self._log_path(self.port).read_text(errors="replace")[-2000:]
        pytest.fail(f"redis-server did not start on 127.0.0.1:{self.port}:\n{log}", pytrace=False)

    def stop(self) -> None:
        """Kill the server abruptly (SIGKILL), as a crashed or partitioned Redis looks."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()  # SIGKILL also ends a paused (SIGSTOPped) process
        process.wait(timeout=STOP_TIMEOUT_S)

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open but nothing answers, as with a
        network partition or a stalled host. Clients see timeouts, not refusals."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def _log_path(self, port: int) -> Path:
        return self._workdir / f"redis-{port}.log"

    def _try_start(self, port: int) -> bool:
        self.port = port
        process = subprocess.Popen(
            [
                self._binary,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self._workdir),
                "--logfile", str(self._log_path(port)),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False  # exited: most likely the port was taken
            if answers_ping(port):
                self._process = process
                return True
            time.sleep(0.02)
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)
        return False


def _started(workdir: Path) -> Iterator[RedisServer]:
    server = RedisServer(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One server for the session; tests keep apart by key namespace, so never stop this one."""
    with tempfile.TemporaryDirectory(prefix="egress-redis-") as workdir:
        yield from _started(Path(workdir))


@pytest.fixture
def private_redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of the test's own, free to be stopped and restarted."""
    yield from _started(tmp_path)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url
