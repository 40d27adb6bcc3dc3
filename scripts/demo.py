"""`make demo`: the gateway beside a local origin, allowing and refusing, with no internet.

Starts, all on loopback: a small DNS server (dnslib) that answers `docs.demo.example` with
127.0.0.2 and `metadata.demo.example` with the cloud metadata address 169.254.169.254; an origin
web server on 127.0.0.2; and a real `egress-gateway serve` subprocess on free ports, configured
only through its settings (`EGRESS_NAMESERVERS` pointing at that DNS server, a policy file that
lets the default principal reach `*.demo.example` and opens 127.0.0.2/32, the origin, as the one
exception to the built-in deny table). Then it sends five requests, prints what each got, and
prints the audit lines they left. Nothing leaves the machine, and everything it started is
stopped before it exits.

This script is not part of the gateway: it drives the gateway from outside, as a client would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
from aiohttp import web
from dnslib import QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer

ORIGIN_IP = "127.0.0.2"
ORIGIN_NAME = "docs.demo.example"
METADATA_NAME = "metadata.demo.example"
METADATA_IP = "169.254.169.254"
REFUSED_NAME = "exfil.example.net"
READY_TIMEOUT_S = 20.0
REQUEST_TIMEOUT_S = 10.0
ORIGIN_PAGE = """<!doctype html>
<html><head><title>Demo origin</title></head>
<body><nav><a href="/">Home</a></nav>
<article><h1>Demo origin</h1>
<p>This page was served on 127.0.0.2 and read through egress-gateway's web_fetch tool.</p>
<p>The menu above is not part of the main content, so it is left out.</p></article></body></html>
"""


class DemoResolver(BaseResolver):  # type: ignore[misc]
    """Two names, A records only; everything else does not exist."""

    ANSWERS: ClassVar[dict[str, str]] = {ORIGIN_NAME: ORIGIN_IP, METADATA_NAME: METADATA_IP}

    def resolve(self, request: DNSRecord, handler: object) -> DNSRecord:
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        address = self.ANSWERS.get(name)
        if address is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif QTYPE[request.q.qtype] == "A":
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(address), ttl=60))
        return reply


def free_port(ip: str, kind: socket.SocketKind = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((ip, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True, slots=True)
class Ports:
    dns: int
    origin: int
    proxy: int
    api: int
    admin: int


def policy_text(origin_port: int) -> str:
    return f"""# The demo's policy: the default principal may reach *.demo.example on 80, 443 and the
# origin's port, and use web_fetch. 127.0.0.2/32 (the origin) is the one exception to the
# built-in deny table; 169.254.169.254 (metadata) stays denied whatever the names say.
version: 1
defaults:
  mode: enforce
  ports: [80, 443, {origin_port}]
  allow_cidrs: ["{ORIGIN_IP}/32"]
principals:
  default:
    egress:
      allow_domains: ["*.demo.example"]
    tools: {{fetch: true, search: false}}
"""


async def start_origin(port: int) -> web.AppRunner:
    async def page(_: web.Request) -> web.Response:
        return web.Response(text=ORIGIN_PAGE, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, ORIGIN_IP, port).start()
    return runner


def gateway_env(workdir: Path, ports: Ports) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(workdir)),
        "EGRESS_POLICY": str(workdir / "policy.yaml"),
        "EGRESS_PROXY_LISTEN": f"127.0.0.1:{ports.proxy}",
        "EGRESS_API_LISTEN": f"127.0.0.1:{ports.api}",
        "EGRESS_ADMIN_LISTEN": f"127.0.0.1:{ports.admin}",
        "EGRESS_NAMESERVERS": f"127.0.0.1:{ports.dns}",
        "EGRESS_AUDIT_LOG": str(workdir / "audit.log"),
        "EGRESS_LOG_LEVEL": "warning",
        "EGRESS_SEARCH_ENGINES": "duckduckgo",
    }


async def wait_ready(process: subprocess.Popen[bytes], admin_port: int, stderr_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"the gateway exited with {process.returncode}:\n{stderr_path.read_text()}")
            try:
                async with session.get(f"http://127.0.0.1:{admin_port}/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise SystemExit(f"the gateway was not ready within {READY_TIMEOUT_S:.0f} s:\n{stderr_path.read_text()}")


async def proxy_exchange(proxy_port: int, head: str, then: str | None = None) -> tuple[str, str, str]:
    """Send one request head to the proxy; return its status line, a refusal's reason and, after a
    CONNECT's 200, the status line of `then` sent inside the tunnel."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
    try:
        writer.write(head.encode())
        await writer.drain()
        response_head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)).decode()
        status = response_head.split("\r\n", 1)[0]
        inner = ""
        if " 200 " not in status:
            # A refusal's JSON body says why: {"error": "<line>", "egress": {"code", "message", ...}}.
            length = next(
                (
                    int(line.split(":", 1)[1])
                    for line in response_head.split("\r\n")
                    if line.lower().startswith("content-length:")
                ),
                0,
            )
            body = await asyncio.wait_for(reader.readexactly(length), REQUEST_TIMEOUT_S)
            return status, json.loads(body)["egress"]["message"], ""
        if then is not None:
            writer.write(then.encode())
            await writer.drain()
            inner_head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)).decode()
            inner = inner_head.split("\r\n", 1)[0]
        return status, "", inner
    finally:
        writer.close()


async def web_fetch(api_port: int, url: str) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://127.0.0.1:{api_port}/v1/fetch", json={"url": url, "maxChars": 400}) as response,
    ):
        return response.status, await response.json()


def show(step: str, outcome: str) -> None:
    print(f"{step:<58} -> {outcome}")


async def run_requests(ports: Ports) -> None:
    origin = f"http://{ORIGIN_NAME}:{ports.origin}/"
    status, body = await web_fetch(ports.api, origin)
    first_line = body.get("content", "").split("\n", 1)[0] if status == 200 else body.get("error", {}).get("code")
    show(f"1. web_fetch {origin}", f"{status} {first_line!r}")

    status_line, _, _ = await proxy_exchange(
        ports.proxy, f"GET {origin} HTTP/1.1\r\nHost: {ORIGIN_NAME}:{ports.origin}\r\nConnection: close\r\n\r\n"
    )
    show(f"2. proxy GET {origin}", status_line)

    metadata = f"http://{METADATA_NAME}/latest/meta-data/"
    status_line, reason, _ = await proxy_exchange(
        ports.proxy, f"GET {metadata} HTTP/1.1\r\nHost: {METADATA_NAME}\r\nConnection: close\r\n\r\n"
    )
    show(f"3. proxy GET {metadata}", f"{status_line}\n{'':61}{reason}")

    authority = f"{ORIGIN_NAME}:{ports.origin}"
    status_line, _, inner = await proxy_exchange(
        ports.proxy,
        f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n",
        then=f"GET / HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n",
    )
    show(f"4. CONNECT {authority}", f"{status_line}; inside: {inner}")

    authority = f"{REFUSED_NAME}:443"
    status_line, reason, _ = await proxy_exchange(
        ports.proxy, f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
    )
    show(f"5. CONNECT {authority}", f"{status_line}\n{'':61}{reason}")


def audit_lines(path: Path, wanted: int) -> list[dict[str, Any]]:
    """The audit file's lines, once `wanted` of them are there (close lines follow a close by a
    few milliseconds) or two seconds have passed."""
    deadline = time.monotonic() + 2.0
    lines: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        if len(lines) >= wanted:
            break
        time.sleep(0.05)
    return lines


AUDIT_FIELDS = ("event", "kind", "host", "port", "method", "decision", "code", "rule", "status", "close_reason")


def summary(line: dict[str, Any]) -> str:
    return " ".join(f"{key}={line[key]}" for key in AUDIT_FIELDS if key in line)


async def demo(workdir: Path) -> int:
    ports = Ports(
        dns=free_port("127.0.0.1", socket.SOCK_DGRAM),
        origin=free_port(ORIGIN_IP),
        proxy=free_port("127.0.0.1"),
        api=free_port("127.0.0.1"),
        admin=free_port("127.0.0.1"),
    )
    (workdir / "policy.yaml").write_text(policy_text(ports.origin))
    dns = DNSServer(DemoResolver(), port=ports.dns, address="127.0.0.1", logger=DNSLogger(log="error", prefix=False))
    dns.start_thread()
    origin = await start_origin(ports.origin)
    stderr_path = workdir / "gateway.stderr"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve"],
            env=gateway_env(workdir, ports),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            cwd=workdir,
        )
    try:
        await wait_ready(process, ports.admin, stderr_path)
        print(f"gateway: proxy 127.0.0.1:{ports.proxy}, tools API 127.0.0.1:{ports.api}")
        print(f"origin:  {ORIGIN_NAME} -> {ORIGIN_IP}:{ports.origin}; {METADATA_NAME} -> {METADATA_IP}")
        print(f"policy:  {workdir / 'policy.yaml'} (default principal: *.demo.example, web_fetch)\n")
        await run_requests(ports)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=REQUEST_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        await origin.cleanup()
        dns.stop()
        dns.server.server_close()
    # fetch 1 line; proxy GET decision+close; metadata 1; CONNECT decision+close; refused 1.
    lines = audit_lines(workdir / "audit.log", wanted=7)
    print(f"\nThe audit lines they left ({workdir / 'audit.log'}; key fields, the full lines are JSON):")
    for line in lines:
        print("  " + summary(line))
    return 0 if process.returncode == 0 else 1


def main() -> int:
    keep = os.environ.get("DEMO_KEEP_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        return asyncio.run(demo(Path(keep)))
    with tempfile.TemporaryDirectory(prefix="egress-demo-") as workdir:
        return asyncio.run(demo(Path(workdir)))


if __name__ == "__main__":
    threading.current_thread().name = "demo"
    sys.exit(main())
