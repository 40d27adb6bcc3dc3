"""A real `egress-gateway serve` subprocess configured only through its settings.

The policy is written to a temporary file; EGRESS_NAMESERVERS points at the fake DNS;
EGRESS_CA_BUNDLE trusts the test CA; listeners take free loopback ports; the audit log goes to
a file the test can read. `start()` waits for /readyz.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import orjson
import yaml

from tests.harness.audit_file import audit_records

READY_TIMEOUT_S = 20.0
MAX_START_ATTEMPTS = 3
LISTEN_KEYS = ("EGRESS_PROXY_LISTEN", "EGRESS_API_LISTEN", "EGRESS_ADMIN_LISTEN")


def free_port(ip: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((ip, 0))
        port: int = sock.getsockname()[1]
        return port


def policy_document(
    *,
    allow_cidrs: Sequence[str] = (),
    ports: Sequence[int] = (80, 443),
    principals: Mapping[str, Any] | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """A policy dict: the default principal may reach everything and use both tools unless given."""
    defaults = dict(sections.pop("defaults", {}))
    defaults.setdefault("ports", sorted(set(ports)))
    defaults.setdefault("allow_cidrs", list(allow_cidrs))
    document: dict[str, Any] = {
        "version": 1,
        "defaults": defaults,
        "principals": dict(principals)
        if principals is not None
        else {
            "default": {"egress": {"allow_domains": ["*"]}, "tools": {"search": True, "fetch": True}},
        },
    }
    document.update(sections)
    return document


class GatewayProcess:
    # Every audit file a harness gateway wrote: the session checks each line against the schema.
    audit_files: list[Path] = []  # noqa: RUF012 - one registry for the session

    def __init__(
        self,
        workdir: Path,
        policy: Mapping[str, Any],
        *,
        nameserver: str,
        ca_bundle: Path | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.policy_path = workdir / "policy.yaml"
        self.audit_path = workdir / "audit.log"
        GatewayProcess.audit_files.append(self.audit_path)
        self.write_policy(policy)
        self.proxy_port = free_port()
        self.api_port = free_port()
        self.admin_port = free_port()
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/tmp"),
            "EGRESS_POLICY": str(self.policy_path),
            "EGRESS_PROXY_LISTEN": f"127.0.0.1:{self.proxy_port}",
            "EGRESS_API_LISTEN": f"127.0.0.1:{self.api_port}",
            "EGRESS_ADMIN_LISTEN": f"127.0.0.1:{self.admin_port}",
            "EGRESS_NAMESERVERS": nameserver,
            "EGRESS_AUDIT_LOG": str(self.audit_path),
            "EGRESS_LOG_LEVEL": "info",
            # No engine reaches the internet from a test unless the test routes it locally.
            "EGRESS_SEARCH_ENGINES": "duckduckgo",
        }
        if ca_bundle is not None:
            self.env["EGRESS_CA_BUNDLE"] = str(ca_bundle)
        self.env.update(env or {})
        # A test may put a listener elsewhere (a wildcard address, a fixed port): follow it.
        self.proxy_port, self.api_port, self.admin_port = (int(self.env[key].rsplit(":", 1)[1]) for key in LISTEN_KEYS)
        self.process: subprocess.Popen[bytes] | None = None
        self.stderr_path = workdir / "stderr.log"
        self.audit_floor = 0  # where the current test's audit lines begin (`begin_share`)

    def write_policy(self, policy: Mapping[str, Any]) -> None:
        tmp = self.policy_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(dict(policy), sort_keys=False))
        tmp.replace(self.policy_path)

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def launch(self) -> GatewayProcess:
        """The process started, without waiting for readiness (a test of an unready gateway)."""
        with self.stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve"],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=self.workdir,
            )
        return self

    def start(self) -> GatewayProcess:
        # A free port can be taken between our probe and the daemon's bind: pick fresh ones.
        for attempt in range(MAX_START_ATTEMPTS):
            with self.stderr_path.open("wb") as stderr:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "gateway", "serve"],
                    env=self.env,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    cwd=self.workdir,
                )
            try:
                self.wait_ready()
                return self
            except RuntimeError:
                if "address already in use" not in self.stderr().lower() or attempt == MAX_START_ATTEMPTS - 1:
                    raise
                self._pick_ports()
        return self

    def _pick_ports(self) -> None:
        # Fresh ports on the same hosts: a wildcard listener stays a wildcard listener.
        ports = []
        for key in LISTEN_KEYS:
            host = self.env[key].rsplit(":", 1)[0]
            port = free_port("0.0.0.0" if host in ("0.0.0.0", "[::]") else "127.0.0.1")
            self.env[key] = f"{host}:{port}"
            ports.append(port)
        self.proxy_port, self.api_port, self.admin_port = ports
        # A DNS listener a test put on one loopback port (its probe can lose the same race).
        dns = self.env.get("EGRESS_DNS_LISTEN", "")
        if dns.startswith("127.0.0.1:") and "," not in dns:
            self.env["EGRESS_DNS_LISTEN"] = f"127.0.0.1:{free_port()}"

    def readyz(self, path: str = "/readyz") -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"{self.admin_url}{path}", timeout=2) as response:
                return response.status, orjson.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, orjson.loads(exc.read() or b"{}")

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.process.returncode}: {self.stderr()}")
            try:
                status, _ = self.readyz()
                # Still ours: a process that lost a port race exits, and another gateway may
                # have taken the admin port it probed meanwhile.
                if status == 200 and self.process.poll() is None:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"gateway not ready after {timeout_s} s: {self.stderr()}")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def audit_mark(self) -> int:
        """How many whole lines the audit log holds now: `audit_lines(since=mark)` is what came after."""
        return self.audit_path.read_bytes().count(b"\n") if self.audit_path.exists() else 0

    def begin_share(self) -> None:
        """A test begins on a gateway its module shares: from now on `audit_lines` and `wait_audit`
        read only the lines written after this point (`shared_for_a_test`)."""
        self.audit_floor = self.audit_mark()

    def audit_lines(self, since: int | None = None) -> list[dict[str, Any]]:
        """The audit lines from line `since` on (by default from the current test's share on)."""
        return audit_records(self.audit_path, self.audit_floor if since is None else since)

    def wait_audit(
        self, predicate: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 5.0, since: int | None = None
    ) -> list[dict[str, Any]]:
        """Audit lines (as `audit_lines(since)`) once `predicate` holds: a proxy close line is
        written when the proxy sees the close, which can be just after the client has its answer."""
        deadline = time.monotonic() + timeout_s
        lines = self.audit_lines(since)
        while not predicate(lines) and time.monotonic() < deadline:
            time.sleep(0.02)
            lines = self.audit_lines(since)
        return lines

    def wait_audit_quiet(self, quiet_s: float = 0.2, timeout_s: float = 3.0) -> None:
        """Until the audit log has not grown for `quiet_s` (at most `timeout_s`): on a gateway a
        module shares, the lines one test caused after its client had its answer (close lines,
        a refusal's security line) land before the next test marks where its own begin."""
        deadline = time.monotonic() + timeout_s
        size, unchanged_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            now = self.audit_path.stat().st_size if self.audit_path.exists() else 0
            if now != size:
                size, unchanged_since = now, time.monotonic()
            elif time.monotonic() - unchanged_since >= quiet_s:
                return
            time.sleep(0.02)

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def stop(self, timeout_s: float = 15.0) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
            raise


G = TypeVar("G", bound=GatewayProcess)


@contextlib.contextmanager
def shared_for_a_test(gateway: G) -> Iterator[G]:
    """One test's turn on a gateway its module shares (a function-scoped fixture's body): the
    test reads only the audit lines written after it began, and the lines it caused but did not
    wait for land before the next test begins."""
    gateway.begin_share()
    try:
        yield gateway
    finally:
        gateway.wait_audit_quiet()
