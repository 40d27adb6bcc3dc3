"""Inspection benchmark (issue 25): inspected HTTPS through the gateway beside a plain CONNECT
tunnel through the same gateway to the same origin, and beside mitmproxy intercepting the same
traffic with a pass-through addon, in one run.

Per path: requests/s and p50/p99 latency of `GET /1k` over kept-alive connections (each
connection: CONNECT, the TLS handshake with the interceptor or the origin, then requests in a
loop), and, for the gateway, its CPU per first request to a new host (CONNECT, leaf mint, the
agent-side and origin-side handshakes, one request), read from /proc around a bounded loop.
The origin is nginx on 127.0.0.2 with a trustme certificate; names resolve through the tests'
fake DNS (TTL 300). mitmproxy pins the same address in its addon (as the gateway pins the vetted
one) and verifies the origin with the same CA. Every loop is bounded by time or count.

    .venv/bin/python bench/inspection.py --seconds 5 --rounds 3 [--mitmdump PATH]

Targets (ratios in the same run): inspected req/s >= 2x mitmproxy's; added p50 over the plain
tunnel <= 1.5 ms; a first request to a new host <= 5 ms of gateway CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import trustme
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gateway.inspect.authority import create_authority, write_authority  # noqa: E402
from tests.harness.dns import FakeDNS  # noqa: E402

ORIGIN_IP = "127.0.0.2"
INSPECTED = "api.bench.example.org"
TUNNELED = "tunnel.example.org"
NEW_HOSTS = "new.bench.example.org"  # h0.new.bench.example.org, h1... : each a first request
NEW_TUNNELS = "new.tunnel.example.org"  # the same, not inspected: the reference for a first request
CONNECTIONS = 8  # kept-alive connections in the throughput phase; the latency phase uses one
BODY_BYTES = 1024
MITM_ADDON = f"""
class PinOrigin:
    # Pass-through: every request is relayed unchanged; the upstream address is pinned to the
    # origin (as the gateway dials the vetted address), so no name is resolved by mitmproxy.
    def server_connect(self, data):
        data.server.address = ("{ORIGIN_IP}", 443)

addons = [PinOrigin()]
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(port: int, host: str = "127.0.0.1", timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {host}:{port}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_nginx(work: Path, ca: trustme.CA) -> subprocess.Popen[bytes]:
    cert = ca.issue_cert(INSPECTED, TUNNELED, f"*.{NEW_HOSTS}", f"*.{NEW_TUNNELS}")
    cert.private_key_and_cert_chain_pem.write_to_path(str(work / "origin.pem"))
    www = work / "www"
    www.mkdir()
    (www / "1k").write_bytes(b"a" * BODY_BYTES)
    conf = work / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx.err warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 300s;
  client_body_temp_path {work}/nb; proxy_temp_path {work}/np; fastcgi_temp_path {work}/nf;
  uwsgi_temp_path {work}/nu; scgi_temp_path {work}/ns;
  server {{
    listen {ORIGIN_IP}:443 ssl;
    ssl_certificate {work}/origin.pem; ssl_certificate_key {work}/origin.pem;
    root {www};
  }}
}}
""")
    proc = subprocess.Popen(["nginx", "-c", str(conf)], stderr=subprocess.DEVNULL)
    wait_port(443, host=ORIGIN_IP)
    return proc


def start_gateway(work: Path, nameserver: str, origin_ca: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    ca_cert, ca_key = work / "ca" / "ca.pem", work / "ca" / "private" / "ca-key.pem"
    write_authority(create_authority(), ca_cert, ca_key)
    policy = {
        "version": 1,
        "defaults": {"ports": [443], "allow_cidrs": [f"{ORIGIN_IP}/32"]},
        "principals": {
            "default": {
                "egress": {"allow_domains": ["*.example.org"]},
                "inspect": [
                    {"host": INSPECTED, "access": "read-only"},
                    {"host": f"*.{NEW_HOSTS}", "access": "read-only"},
                ],
            }
        },
        "proxy": {"max_tunnels_per_principal": 4096, "max_tunnels_total": 8192},
    }
    (work / "policy.yaml").write_text(yaml.safe_dump(policy))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(work),
        "EGRESS_POLICY": str(work / "policy.yaml"),
        "EGRESS_PROXY_LISTEN": f"127.0.0.1:{port}",
        "EGRESS_API_LISTEN": f"127.0.0.1:{free_port()}",
        "EGRESS_ADMIN_LISTEN": f"127.0.0.1:{free_port()}",
        "EGRESS_NAMESERVERS": nameserver,
        "EGRESS_CA_BUNDLE": str(origin_ca),
        "EGRESS_AUDIT_LOG": str(work / "audit.log"),
        "EGRESS_LOG_LEVEL": "warning",
        "EGRESS_SEARCH_ENGINES": "duckduckgo",
        "EGRESS_INSPECT_CA_CERT": str(ca_cert),
        "EGRESS_INSPECT_CA_KEY": str(ca_key),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve"],
        env=env,
        cwd=REPO,
        stderr=open(work / "gateway.err", "wb"),  # noqa: SIM115 - lives as long as the process
    )
    wait_port(port)
    return proc, port, ca_cert


def start_mitmdump(mitmdump: str, work: Path, origin_ca: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    confdir = work / "mitm"
    confdir.mkdir()
    addon = work / "pin_origin.py"
    addon.write_text(MITM_ADDON)
    proc = subprocess.Popen(
        [
            mitmdump,
            "--quiet",
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            str(port),
            "--set",
            f"confdir={confdir}",
            "--set",
            f"ssl_verify_upstream_trusted_ca={origin_ca}",
            "--set",
            "http2=false",
            "--set",
            "flow_detail=0",
            "-s",
            str(addon),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(work / "mitm.err", "wb"),  # noqa: SIM115 - lives as long as the process
    )
    wait_port(port)
    deadline = time.monotonic() + 30
    while not (confdir / "mitmproxy-ca-cert.pem").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, port, confdir / "mitmproxy-ca-cert.pem"


# --- load generator (a child process, so its CPU is not the measured server's) -----------------


async def _connection(
    port: int, host: str, ca: str, deadline: float, latencies: list[float], limit: int | None = None
) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(head.decode(errors="replace"))
    context = ssl.create_default_context(cafile=ca)
    context.set_alpn_protocols(["http/1.1"])
    await writer.start_tls(context, server_hostname=host)
    request = f"GET /1k HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    done = 0
    while (done < limit) if limit is not None else (time.monotonic() < deadline):
        started = time.perf_counter()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await reader.readexactly(length)
        latencies.append(time.perf_counter() - started)
        done += 1
    writer.close()
    return done


async def load_requests(port: int, host: str, ca: str, seconds: float, connections: int) -> dict[str, Any]:
    latencies: list[float] = []
    started = time.monotonic()
    deadline = started + seconds
    counts = await asyncio.gather(*(_connection(port, host, ca, deadline, latencies) for _ in range(connections)))
    elapsed = time.monotonic() - started
    ordered = sorted(latencies)
    return {
        "requests": sum(counts),
        "rps": sum(counts) / elapsed,
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
    }


async def first_requests(port: int, ca: str, suffix: str, start: int, count: int) -> int:
    """One connection and one request per new host, one after another (bounded by `count`)."""
    for index in range(start, start + count):
        await _connection(port, f"h{index}.{suffix}", ca, 0.0, [], limit=1)
    return count


def child_main(args: list[str]) -> None:
    import uvloop  # noqa: PLC0415

    kind = args[0]
    if kind == "load":
        port, host, ca, seconds, connections = int(args[1]), args[2], args[3], float(args[4]), int(args[5])
        result = uvloop.run(load_requests(port, host, ca, seconds, connections))
    else:
        port, ca, suffix, start, count = int(args[1]), args[2], args[3], int(args[4]), int(args[5])
        result = {"hosts": uvloop.run(first_requests(port, ca, suffix, start, count))}
    sys.stdout.write(orjson.dumps(result).decode())


def run_child(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, timeout=300, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    result: dict[str, Any] = orjson.loads(out.stdout)
    return result


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-hosts", type=int, default=100, help="first requests measured for CPU")
    parser.add_argument("--mitmdump", default=shutil.which("mitmdump") or str(Path(sys.executable).parent / "mitmdump"))
    options = parser.parse_args()
    if not Path(options.mitmdump).exists():
        sys.exit("mitmdump not found: pip install -e '.[bench]' (or a venv of its own, --mitmdump PATH)")
    work = Path(tempfile.mkdtemp(prefix="bench-inspect-"))
    ca = trustme.CA()
    origin_ca = work / "origin-ca.pem"
    ca.cert_pem.write_to_path(str(origin_ca))
    dns = FakeDNS().start()
    for name in (INSPECTED, TUNNELED):
        dns.add(name, ORIGIN_IP, ttl=300)
    for index in range(options.new_hosts * (options.rounds + 1)):
        dns.add(f"h{index}.{NEW_HOSTS}", ORIGIN_IP, ttl=300)
        dns.add(f"h{index}.{NEW_TUNNELS}", ORIGIN_IP, ttl=300)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(start_nginx(work, ca))
        gateway, gateway_port, gateway_ca = start_gateway(work, dns.nameserver, origin_ca)
        processes.append(gateway)
        mitm, mitm_port, mitm_ca = start_mitmdump(options.mitmdump, work, origin_ca)
        processes.append(mitm)
        paths = {
            "gateway inspected": (gateway_port, INSPECTED, str(gateway_ca)),
            "gateway tunnel": (gateway_port, TUNNELED, str(origin_ca)),
            "mitmproxy": (mitm_port, INSPECTED, str(mitm_ca)),
        }
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
        single: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
        firsts: dict[str, list[float]] = {"inspected": [], "tunnel": []}
        next_host = 0
        # Warm-up: each path's connections and leaves exist before anything is timed.
        for port, host, cafile in paths.values():
            run_child("load", str(port), host, cafile, "0.5", str(CONNECTIONS))
        for _ in range(options.rounds):
            for name, (port, host, cafile) in paths.items():  # alternated, round by round
                rows[name].append(run_child("load", str(port), host, cafile, str(options.seconds), str(CONNECTIONS)))
                single[name].append(run_child("load", str(port), host, cafile, str(options.seconds / 2), "1"))
            for kind, suffix, trusted in (("inspected", NEW_HOSTS, gateway_ca), ("tunnel", NEW_TUNNELS, origin_ca)):
                before = cpu_seconds(gateway.pid)
                run_child("first", str(gateway_port), str(trusted), suffix, str(next_host), str(options.new_hosts))
                firsts[kind].append((cpu_seconds(gateway.pid) - before) / options.new_hosts * 1000)
            next_host += options.new_hosts
        report(rows, single, firsts)
    finally:
        for proc in reversed(processes):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        dns.stop()
        shutil.rmtree(work, ignore_errors=True)


def report(
    rows: dict[str, list[dict[str, Any]]], single: dict[str, list[dict[str, Any]]], firsts: dict[str, list[float]]
) -> None:
    print(f"{CONNECTIONS} kept-alive connections (throughput) | 1 connection (latency); medians of the rounds")
    print(f"{'path':<20} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} | {'p50 ms':>8} {'p99 ms':>8}   req/s each round")
    med: dict[str, dict[str, float]] = {}
    for name, results in rows.items():
        med[name] = {key: statistics.median(r[key] for r in results) for key in ("rps", "p50_ms", "p99_ms")}
        one = {key: statistics.median(r[key] for r in single[name]) for key in ("p50_ms", "p99_ms")}
        med[name] |= {"p50_one": one["p50_ms"], "p99_one": one["p99_ms"]}
        each = ", ".join(f"{r['rps']:.0f}" for r in results)
        print(
            f"{name:<20} {med[name]['rps']:>9.0f} {med[name]['p50_ms']:>8.2f} {med[name]['p99_ms']:>8.2f} | "
            f"{one['p50_ms']:>8.2f} {one['p99_ms']:>8.2f}   [{each}]"
        )
    inspected, tunnel, mitm = med["gateway inspected"], med["gateway tunnel"], med["mitmproxy"]
    first_inspected, first_tunnel = statistics.median(firsts["inspected"]), statistics.median(firsts["tunnel"])
    print()
    print(f"inspected req/s / mitmproxy req/s:   {inspected['rps'] / mitm['rps']:.2f}x   (target >= 2x)")
    print(
        f"added p50 over the plain tunnel:     {inspected['p50_one'] - tunnel['p50_one']:.2f} ms one connection, "
        f"{inspected['p50_ms'] - tunnel['p50_ms']:.2f} ms at {CONNECTIONS}   (target <= 1.5 ms)"
    )
    print(
        f"gateway CPU, first request to a new host: inspected {first_inspected:.2f} ms, tunnel {first_tunnel:.2f} ms, "
        f"added by interception {first_inspected - first_tunnel:.2f} ms   (target <= 5 ms)"
    )


if __name__ == "__main__":
    main()
