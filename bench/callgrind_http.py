"""User-space instructions per plain-HTTP forwarded request, counted by callgrind (deterministic).

CPU time on a shared 2-core machine moves by 10% between runs; an instruction count of the same
tree moves by well under 1%. This runs the proxy as `bench/proxy.py` does (full policy path,
audit lines to a file, uvloop, start-up objects frozen) under `valgrind --tool=callgrind`, with an
nginx origin serving 1 KiB, warms it up, zeroes the counters, sends `--requests` keep-alive
absolute-URI `GET`s of 1 KiB one after the other on one connection (or `--connections` of them
in turn, one request each per round), dumps the counters and prints instructions per request.

    .venv/bin/python bench/callgrind_http.py [--requests 1000] [--connections 1] [--keep DIR]

`--keep DIR` keeps the callgrind dump for `callgrind_annotate --inclusive=yes`. Needs nginx and
valgrind (root not required). `BENCH_ORIGIN_IP` moves the origin as in `bench/proxy.py`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.harness.dns import FakeDNS  # noqa: E402 - after the path insert

ORIGIN_IP = os.environ.get("BENCH_ORIGIN_IP", "127.0.0.2")
NAME = "bench.example.org"
WARM_UP_REQUESTS = 200
BODY_1K = 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, host: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{host}:{port} did not open")


def start_nginx(work: Path) -> subprocess.Popen[bytes]:
    www = work / "www"
    www.mkdir()
    (www / "1k").write_bytes(b"a" * BODY_1K)
    conf = work / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx.err warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 300s;
  client_body_temp_path {work}/nb; proxy_temp_path {work}/np; fastcgi_temp_path {work}/nf;
  uwsgi_temp_path {work}/nu; scgi_temp_path {work}/ns;
  server {{ listen {ORIGIN_IP}:80; root {www}; }}
}}
""")
    proc = subprocess.Popen(["nginx", "-c", str(conf)], stderr=subprocess.DEVNULL)
    wait_port(80, ORIGIN_IP, 15)
    return proc


def start_gateway(work: Path, nameserver: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    policy = {
        "version": 1,
        "defaults": {"ports": [80, 443], "allow_cidrs": [f"{ORIGIN_IP}/32"]},
        "principals": {"default": {"egress": {"allow_domains": ["*.example.org"]}}},
    }
    (work / "policy.yaml").write_text(yaml.safe_dump(policy))
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={work}/callgrind.out",
        sys.executable,
        str(REPO / "bench" / "proxy.py"),
        "--serve-gateway",
        str(work / "policy.yaml"),
        nameserver,
        str(work / "audit.log"),
        str(port),
    ]
    proc = subprocess.Popen(command, stderr=open(work / "gateway.err", "wb"))  # noqa: SIM115
    wait_port(port, "127.0.0.1", 120)
    return proc, port


def read_response(sock: socket.socket, pending: bytes) -> bytes:
    """Read one response with a Content-Length body; returns the bytes after it."""
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
    length = int(lowered[at : lowered.find(b"\r\n", at) if lowered.find(b"\r\n", at) > 0 else None])
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("the proxy closed the connection mid-body")
        rest += chunk
    return rest[length:]


def send_requests(socks: list[socket.socket], count: int) -> None:
    request = f"GET http://{NAME}/1k HTTP/1.1\r\nHost: {NAME}\r\n\r\n".encode()
    pending = [b""] * len(socks)
    for i in range(count):
        which = i % len(socks)
        socks[which].sendall(request)
        pending[which] = read_response(socks[which], pending[which])


def callgrind_control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, stdout=subprocess.DEVNULL, timeout=120)


def total_instructions(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith("summary:") or line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dump}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=None, help="copy the callgrind dump here")
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-callgrind-"))
    work.chmod(0o755)  # nginx workers run as another user and read the files here
    dns = FakeDNS().start()
    dns.add(NAME, ORIGIN_IP, ttl=300)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(start_nginx(work))
        gateway, port = start_gateway(work, dns.nameserver)
        procs.append(gateway)
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(options.connections)]
        send_requests(socks, WARM_UP_REQUESTS)
        before = set(work.glob("callgrind.out*"))
        callgrind_control("--zero", str(gateway.pid))
        send_requests(socks, options.requests)
        callgrind_control("--dump", str(gateway.pid))
        deadline = time.monotonic() + 60
        dumps: set[Path] = set()
        while not dumps and time.monotonic() < deadline:
            time.sleep(0.2)
            dumps = set(work.glob("callgrind.out*")) - before
        if not dumps:
            raise RuntimeError("callgrind wrote no dump")
        dump = max(dumps, key=lambda path: path.stat().st_mtime)
        time.sleep(0.5)  # the dump is written in one go, but let it finish
        instructions = total_instructions(dump)
        print(f"{instructions / options.requests / 1000:.1f} k instructions per request ({options.requests} requests)")
        if options.keep is not None:
            options.keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(dump, options.keep / "callgrind.http.out")
        for sock in socks:
            sock.close()
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        dns.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
