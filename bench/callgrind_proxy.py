"""User-space instructions per proxy operation under callgrind: deterministic where CPU time is not.

Runs the gateway's proxy (`bench/proxy.py --serve-gateway`, the bench's wiring: full policy path,
DNS cache, audit to a file, metrics) under `valgrind --tool=callgrind` with nginx and the fake DNS
as `bench/proxy.py` sets them up, warms it (200 tunnels, 200 requests), then counts the
instructions the process executes for `--tunnels` sequential CONNECT → 200 → close (one client
socket at a time, no TLS through the tunnel) and for `--requests` keep-alive absolute-URI
`GET /1k` one after the other (on one connection, or on `--connections` of them in turn, one
request each per round), and prints them per operation. Repeated runs of one tree agree within
about ±3 k instructions per operation (up to 5.7 k per tunnel: the deadline wheel's and the
audit flush's timers run by wall time, which valgrind stretches and load stretches further), so
two trees can be compared where CPU time on a shared machine cannot: interleave them, run each
more than once, and compare only runs with the same counts and parts (the per-request figure
with `--tunnels 0` reads about 30 k higher than after the tunnels). Sequential tunnels flush the
audit buffer about once per tunnel, so its share is overstated. `--concurrency N` opens the
tunnels (warm-up included, from a cold DNS cache) from N client threads at once instead, as a
concurrent load does.

    .venv/bin/python bench/callgrind_proxy.py [--tree DIR ...] [--tunnels 1000] [--requests 1000]
        [--connections 1] [--keep-dump DIR] [--concurrency N] [--floor | --duties]

Each `--tree` (default: this checkout) is measured in turn, in its own gateway process; pass
frozen copies (`cp -r`) of the trees to compare, not a tree being edited. `--tunnels 0` or
`--requests 0` skips that part. `--keep-dump DIR` keeps each part's callgrind dump there
(`<tree>.tunnels.cg`, `<tree>.requests.cg`, for `callgrind_annotate --inclusive=yes`). `--python`
is the interpreter run under valgrind (default this one). `--floor` measures `bench/proxy_floor.py`
(the least a uvloop proxy does, dialing the origin's address) in the same way instead of the
gateway, `--duties` measures `bench/proxy_duties.py` (the floor plus each of the gateway's duties
done the cheapest way). Needs root (nginx binds :80/:443 on BENCH_ORIGIN_IP, default 127.0.0.2), nginx and
valgrind.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import trustme
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from proxy import NAME, ORIGIN_IP, free_port, start_nginx, wait_port  # noqa: E402 - bench/proxy.py, beside this file

from tests.harness.dns import FakeDNS  # noqa: E402

WARM_OPERATIONS = 200
# The gateway starts about 50 times slower under valgrind.
START_TIMEOUT_S = 300.0
BODY_1K = 1024
DUMP_TIMEOUT_S = 30.0


def policy_text() -> str:
    return yaml.safe_dump(
        {
            "version": 1,
            "defaults": {"ports": [80, 443], "allow_cidrs": [f"{ORIGIN_IP}/32"]},
            "principals": {"default": {"egress": {"allow_domains": ["*.example.org"]}}},
            "proxy": {"max_tunnels_per_principal": 4096, "max_tunnels_total": 8192},
        }
    )


def concurrent_tunnels(port: int, count: int, concurrency: int) -> None:
    """`count` tunnels, `concurrency` clients at a time (each opens its share one after another)."""
    if concurrency <= 1:
        tunnels(port, count)
        return
    with ThreadPoolExecutor(concurrency) as pool:
        for done in [pool.submit(tunnels, port, count // concurrency) for _ in range(concurrency)]:
            done.result()


def tunnels(port: int, count: int) -> None:
    request = f"CONNECT {NAME}:443 HTTP/1.1\r\nHost: {NAME}:443\r\n\r\n".encode()
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(request)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    raise RuntimeError(f"tunnel refused: {data!r}")
                data += chunk
            if b" 200 " not in data.split(b"\r\n", 1)[0]:
                raise RuntimeError(f"tunnel refused: {data!r}")


def read_response(sock: socket.socket, pending: bytes) -> bytes:
    """Read one 200 response with a Content-Length body; returns the bytes after it."""
    while b"\r\n\r\n" not in pending:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("the proxy closed the connection")
        pending += chunk
    head, _, rest = pending.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected response: {head[:80]!r}")
    lowered = head.lower()
    at = lowered.index(b"content-length:") + len(b"content-length:")
    end = lowered.find(b"\r\n", at)
    length = int(lowered[at : end if end > 0 else None])
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("the proxy closed the connection mid-body")
        rest += chunk
    return rest[length:]


def requests(port: int, count: int, connections: int) -> None:
    request = f"GET http://{NAME}/1k HTTP/1.1\r\nHost: {NAME}\r\n\r\n".encode()
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
    try:
        pending = [b""] * connections
        for i in range(count):
            which = i % connections
            socks[which].sendall(request)
            pending[which] = read_response(socks[which], pending[which])
    finally:
        for sock in socks:
            sock.close()


class Callgrind:
    """The gateway under callgrind, its counters zeroed and dumped through `callgrind_control`."""

    def __init__(self, tree: Path, python: str, work: Path, nameserver: str, *, sketch: str | None = None) -> None:
        self.work = work
        self.port = free_port()
        (work / "policy.yaml").write_text(policy_text())
        served = [
            str(tree / "bench" / "proxy.py"),
            "--serve-gateway",
            str(work / "policy.yaml"),
            nameserver,
            str(work / "audit.log"),
            str(self.port),
        ]
        if sketch is not None:
            served = [str(tree / "bench" / sketch), str(self.port), ORIGIN_IP]
        command = [
            "valgrind",
            "--tool=callgrind",
            # Names in full in every dump: a later dump may not repeat what an earlier one defined.
            "--compress-strings=no",
            f"--callgrind-out-file={work}/cg.%p",
            python,
            *served,
        ]
        with open(work / "gateway.err", "wb") as err:
            self.proc = subprocess.Popen(command, stderr=err, stdout=subprocess.DEVNULL)
        wait_port(self.port, timeout_s=START_TIMEOUT_S)

    def zero(self) -> None:
        subprocess.run(["callgrind_control", "--zero", str(self.proc.pid)], capture_output=True, check=True)

    def instructions(self, keep: Path | None = None) -> int:
        """Instructions since the last `zero` (dumped to a file and read back; copied to the file `keep`)."""
        for path in glob.glob(f"{self.work}/cg.*"):
            os.remove(path)
        subprocess.run(["callgrind_control", "--dump", str(self.proc.pid)], capture_output=True, check=True)
        deadline = time.monotonic() + DUMP_TIMEOUT_S
        while time.monotonic() < deadline:
            total = 0
            for path in glob.glob(f"{self.work}/cg.*"):
                for line in Path(path).read_text().splitlines():
                    if line.startswith(("summary:", "totals:")):
                        total = max(total, int(line.split()[1]))
            if total:
                if keep is not None:
                    for path in glob.glob(f"{self.work}/cg.*"):
                        shutil.copy(path, keep)
                return total
            time.sleep(0.2)
        raise RuntimeError("callgrind wrote no dump")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def measure(tree: Path, python: str, nameserver: str, counts: argparse.Namespace) -> str:
    work = Path(tempfile.mkdtemp(prefix="cg-proxy-"))
    work.chmod(0o777)
    keep: Path | None = counts.keep_dump
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    sketch = "proxy_floor.py" if counts.floor else "proxy_duties.py" if counts.duties else None
    gateway = Callgrind(tree, python, work, nameserver, sketch=sketch)
    concurrency = max(counts.concurrency, 1)
    try:
        concurrent_tunnels(gateway.port, WARM_OPERATIONS, concurrency)
        requests(gateway.port, WARM_OPERATIONS, counts.connections)
        parts = []
        if counts.tunnels:
            gateway.zero()
            concurrent_tunnels(gateway.port, counts.tunnels, concurrency)
            opened = counts.tunnels // concurrency * concurrency
            dump = keep / f"{tree.name}.tunnels.cg" if keep is not None else None
            parts.append(f"{gateway.instructions(dump) / opened / 1000:.1f} k instructions per tunnel")
        if counts.requests:
            gateway.zero()
            requests(gateway.port, counts.requests, counts.connections)
            dump = keep / f"{tree.name}.requests.cg" if keep is not None else None
            per_request = gateway.instructions(dump) / counts.requests / 1000
            parts.append(f"{per_request:.1f} k per HTTP request ({counts.connections} connection(s))")
        return f"{tree}{f' (bench/{sketch})' if sketch else ''}: " + ", ".join(parts)
    finally:
        gateway.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tree", action="append", type=Path, help="a checkout to measure (repeatable)")
    parser.add_argument("--tunnels", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=1, help="keep-alive connections the requests take turns on")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--concurrency", type=int, default=1, help="client threads opening tunnels at once")
    sketches = parser.add_mutually_exclusive_group()
    sketches.add_argument("--floor", action="store_true", help="measure bench/proxy_floor.py instead of the gateway")
    sketches.add_argument("--duties", action="store_true", help="measure bench/proxy_duties.py instead of the gateway")
    parser.add_argument("--keep-dump", type=Path, help="a directory to keep each part's callgrind dump in")
    args = parser.parse_args()
    trees: list[Path] = args.tree or [REPO]
    work = Path(tempfile.mkdtemp(prefix="cg-origin-"))
    work.chmod(0o777)
    ca = trustme.CA()
    dns = FakeDNS().start()
    dns.add(NAME, ORIGIN_IP, ttl=300)
    nginx = start_nginx(work, ca)
    try:
        for tree in trees:
            started = time.monotonic()
            line = measure(tree.resolve(), args.python, dns.nameserver, args)
            print(f"{line} ({time.monotonic() - started:.0f} s)", flush=True)
    finally:
        nginx.send_signal(signal.SIGTERM)
        nginx.wait(10)
        dns.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
