"""Real Redis deployments beyond one server: Sentinel, Cluster and TLS, as pytest fixtures.

Owns the processes: Debian's `redis-server` in each role (`--sentinel` for the sentinels,
`--cluster-enabled` plus `redis-cli --cluster create` for the cluster, `--tls-port` with trustme
certificates for TLS), all on free loopback ports, no persistence, killed at teardown. Every wait
is bounded and fails the test with the server's log. Nothing here is skipped: a missing binary
fails the run.

- `redis_sentinel` (module): one primary, one replica, three sentinels (quorum 2) with short
  failover timeouts, so a killed primary is replaced within a few seconds.
- `redis_cluster` (session): three masters covering all 16384 slots, no replicas.
- `redis_tls` (session): one TLS-only server and the CA bundle that trusts it.
"""

from __future__ import annotations

import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme

from tests.harness.redis_server import STOP_TIMEOUT_S, free_loopback_port

START_TIMEOUT_S = 15.0
SENTINEL_SETTLE_S = 20.0
FAILOVER_TIMEOUT_S = 30.0
CLUSTER_BUS_OFFSET = 10000
SERVICE = "egress-primary"
# Sentinel timings: a primary silent for 500 ms is down; a failover that stalls is retried fast.
DOWN_AFTER_MS = 500
SENTINEL_FAILOVER_TIMEOUT_MS = 2000


def _binary(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (apt-get install -y {package}); Redis tests never skip", pytrace=False)
    return path


def command(port: int, *args: str, tls: ssl.SSLContext | None = None, timeout_s: float = 1.0) -> bytes:
    """One RESP command over a fresh socket; the raw reply (enough for status checks)."""
    payload = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args)
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    # wrap_socket takes the descriptor over: the wrapper is what must be closed.
    with tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls else raw as conn:
        conn.sendall(payload)
        reply = b""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            chunk = conn.recv(65536)
            if not chunk:
                break
            reply += chunk
            if reply.endswith(b"\r\n"):
                break
        return reply


def _answers(port: int, tls: ssl.SSLContext | None = None) -> bool:
    try:
        return command(port, "PING", tls=tls).startswith(b"+PONG")
    except OSError:
        return False


def _free_port_pair() -> int:
    """A port whose cluster bus port (port + 10000) is free too."""
    for _ in range(50):
        port = free_loopback_port()
        if port + CLUSTER_BUS_OFFSET < 65536:
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port + CLUSTER_BUS_OFFSET))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free port pair for a cluster node")


@dataclass
class RedisProcess:
    """One redis-server in any role; `kill()` is abrupt (SIGKILL), as a crashed host looks."""

    workdir: Path
    port: int
    args: Sequence[str]
    tls: ssl.SSLContext | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return self.workdir / f"redis-{self.port}.log"

    def start(self) -> None:
        binary = _binary("redis-server", "redis-server")
        self.process = subprocess.Popen(
            [binary, *self.args, "--logfile", str(self.log_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.workdir,
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                break
            if _answers(self.port, self.tls):
                return
            time.sleep(0.02)
        pytest.fail(f"redis on port {self.port} did not start:\n{self.log()}", pytrace=False)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing answers (a stalled host)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)


def _data_node_args(port: int, workdir: Path) -> list[str]:
    return ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)]


@dataclass
class SentinelGroup:
    workdir: Path
    primary: RedisProcess
    replica: RedisProcess
    sentinels: list[RedisProcess]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def primary_port(self) -> int | None:
        """The primary's port as the sentinels report it, None while they disagree or fail."""
        ports = set()
        for sentinel in self.sentinels:
            try:
                reply = command(sentinel.port, "SENTINEL", "get-master-addr-by-name", SERVICE)
            except OSError:
                return None
            parts = reply.split(b"\r\n")
            if len(parts) < 5:
                return None
            ports.add(int(parts[4]))
        return ports.pop() if len(ports) == 1 else None

    def wait_settled(self) -> None:
        """Every sentinel knows the replica and the other two: a failover can then be elected."""
        deadline = time.monotonic() + SENTINEL_SETTLE_S
        while time.monotonic() < deadline:
            if all(self._knows_everyone(s.port) for s in self.sentinels) and self._replica_in_sync():
                return
            time.sleep(0.1)
        logs = "\n".join(s.log() for s in self.sentinels)
        pytest.fail(f"sentinels did not discover each other and the replica:\n{logs}", pytrace=False)

    def _knows_everyone(self, port: int) -> bool:
        try:
            others = command(port, "SENTINEL", "sentinels", SERVICE, timeout_s=0.5)
            replicas = command(port, "SENTINEL", "replicas", SERVICE, timeout_s=0.5)
        except OSError:
            return False
        return others.startswith(b"*2") and replicas.startswith(b"*1")

    def wait_replica_in_sync(self) -> None:
        deadline = time.monotonic() + SENTINEL_SETTLE_S
        while not self._replica_in_sync():
            if time.monotonic() > deadline:
                pytest.fail(f"the replica did not catch up:\n{self.replica.log()}", pytrace=False)
            time.sleep(0.05)

    def _replica_in_sync(self) -> bool:
        try:
            info = command(self.replica.port, "INFO", "replication", timeout_s=0.5)
        except OSError:
            return False
        return b"master_link_status:up" in info

    def kill_primary_and_wait_for_failover(self) -> int:
        """SIGKILL the primary; return the new primary's port once all sentinels agree on it."""
        old = self.primary.port
        self.primary.kill()
        deadline = time.monotonic() + FAILOVER_TIMEOUT_S
        while time.monotonic() < deadline:
            port = self.primary_port()
            if port is not None and port != old:
                return port
            time.sleep(0.1)
        logs = "\n".join(s.log() for s in self.sentinels)
        pytest.fail(f"no failover within {FAILOVER_TIMEOUT_S} s:\n{logs}", pytrace=False)

    def stop(self) -> None:
        for process in (*self.sentinels, self.replica, self.primary):
            process.kill()


def start_sentinel_group(workdir: Path) -> SentinelGroup:
    primary_port, replica_port = free_loopback_port(), free_loopback_port()
    primary = RedisProcess(workdir, primary_port, _data_node_args(primary_port, workdir))
    replica = RedisProcess(
        workdir,
        replica_port,
        [*_data_node_args(replica_port, workdir), "--replicaof", "127.0.0.1", str(primary_port)],
    )
    sentinels: list[RedisProcess] = []
    for _ in range(3):
        port = free_loopback_port()
        config = workdir / f"sentinel-{port}.conf"
        # Sentinel rewrites its config file as it learns the topology, so each gets its own.
        config.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {SENTINEL_FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        sentinels.append(RedisProcess(workdir, port, [str(config), "--sentinel"]))
    group = SentinelGroup(workdir, primary, replica, sentinels)
    try:
        for process in (primary, replica, *sentinels):
            process.start()
        for process in (primary, replica, *sentinels):
            process.wait_ready()
        group.wait_settled()
    except BaseException:
        group.stop()
        raise
    return group


@dataclass
class ClusterNodes:
    nodes: list[RedisProcess]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()


def start_cluster(workdir: Path, size: int = 3) -> ClusterNodes:
    nodes: list[RedisProcess] = []
    for _ in range(size):
        port = _free_port_pair()
        args = [
            *_data_node_args(port, workdir),
            "--cluster-enabled", "yes",
            "--cluster-config-file", f"nodes-{port}.conf",
            "--cluster-node-timeout", "2000",
        ]  # fmt: skip
        nodes.append(RedisProcess(workdir, port, args))
    cluster = ClusterNodes(nodes)
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            node.wait_ready()
        create = [
            _binary("redis-cli", "redis-tools"),
            "--cluster", "create",
            *(f"127.0.0.1:{n.port}" for n in nodes),
            "--cluster-replicas", "0",
            "--cluster-yes",
        ]  # fmt: skip
        created = subprocess.run(
            create,
            capture_output=True,
            timeout=START_TIMEOUT_S,
            check=False,
        )
        if created.returncode != 0:
            pytest.fail(f"redis-cli --cluster create failed:\n{created.stdout!r}\n{created.stderr!r}", pytrace=False)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(b"cluster_state:ok" in command(n.port, "CLUSTER", "INFO") for n in nodes):
            if time.monotonic() > deadline:
                pytest.fail("the cluster did not reach cluster_state:ok", pytrace=False)
            time.sleep(0.05)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@dataclass
class TlsRedis:
    server: RedisProcess
    ca_path: Path

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.server.port}/0"


def start_tls_redis(workdir: Path) -> TlsRedis:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    ca_path, cert_path, key_path = workdir / "ca.pem", workdir / "server.pem", workdir / "server.key"
    ca.cert_pem.write_to_path(str(ca_path))
    leaf.cert_chain_pems[0].write_to_path(str(cert_path))
    leaf.private_key_pem.write_to_path(str(key_path))
    client = ssl.create_default_context(cafile=str(ca_path))
    port = free_loopback_port()
    args = [
        *_data_node_args(0, workdir),
        "--tls-port", str(port),
        "--tls-cert-file", str(cert_path),
        "--tls-key-file", str(key_path),
        "--tls-ca-cert-file", str(ca_path),
        "--tls-auth-clients", "no",
    ]  # fmt: skip
    server = RedisProcess(workdir, port, args, tls=client)
    server.start()
    try:
        server.wait_ready()
    except BaseException:
        server.kill()
        raise
    return TlsRedis(server, ca_path)


@pytest.fixture(scope="module")
def redis_sentinel() -> Iterator[SentinelGroup]:
    with tempfile.TemporaryDirectory(prefix="egress-sentinel-") as workdir:
        group = start_sentinel_group(Path(workdir))
        try:
            yield group
        finally:
            group.stop()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterNodes]:
    with tempfile.TemporaryDirectory(prefix="egress-cluster-") as workdir:
        cluster = start_cluster(Path(workdir))
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture(scope="session")
def redis_tls() -> Iterator[TlsRedis]:
    with tempfile.TemporaryDirectory(prefix="egress-tls-redis-") as workdir:
        tls = start_tls_redis(Path(workdir))
        try:
            yield tls
        finally:
            tls.server.kill()
