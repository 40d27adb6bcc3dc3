"""The "internet" namespace of the transparent tests, run as its own process inside that namespace.

`python -m tests.transparent.world DIR` reads DIR/world.json and serves, on the namespace's own
addresses: the upstream DNS (dnslib, UDP and TCP port 53, every query appended to DIR/dns.log),
TLS and plain HTTP origins (trustme certificates, CA written to DIR/test-ca.pem) answering
`origin=<ip> host=<Host>`, a banner TCP server (DIR/raw.log gets a line per connection) and a UDP
sink (DIR/udp.log gets a line per datagram). DIR/ready appears once everything is bound; SIGTERM
stops it.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from dnslib import QTYPE, DNSRecord
from dnslib.server import DNSLogger, DNSServer

from tests.harness.certs import TestPKI
from tests.harness.dns import _Script, _ScriptedResolver


class _LoggingResolver(_ScriptedResolver):
    def __init__(self, log_path: Path) -> None:
        super().__init__()
        self.log_path = log_path

    def resolve(self, request: DNSRecord, handler: object) -> DNSRecord:
        with self.log_path.open("a") as log:
            log.write(f"{str(request.q.qname).rstrip('.').lower()} {QTYPE[request.q.qtype]}\n")
        return super().resolve(request, handler)


async def _handler(request: web.Request) -> web.Response:
    sockname = request.transport.get_extra_info("sockname") if request.transport else ("?", 0)
    if request.path == "/echo-auth":
        # The credential tests: what the origin received, reflected as echo endpoints do.
        return web.Response(text=f"authorization={request.headers.get('Authorization', '')}\n")
    return web.Response(text=f"origin={sockname[0]} host={request.host}\n")


class _UdpSink(asyncio.DatagramProtocol):
    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        with self.log_path.open("a") as log:
            log.write(f"{addr[0]} {data!r}\n")


async def main(directory: Path) -> None:
    config = orjson.loads((directory / "world.json").read_bytes())
    resolver = _LoggingResolver(directory / "dns.log")
    for name, answers in config["dns"].items():
        resolver.scripts[name] = _Script([answers], config.get("dns_ttl", {}).get(name, 0))
    servers = [
        DNSServer(resolver, port=53, address=config["dns_ip"], logger=DNSLogger(log="-", prefix=False), tcp=tcp)
        for tcp in (False, True)
    ]
    for server in servers:
        server.start_thread()
    pki = TestPKI(directory)
    runners: list[web.AppRunner] = []
    for origin in config["origins"]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", _handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        context = pki.server_context(*origin["names"]) if origin["tls"] else None
        await web.TCPSite(runner, origin["ip"], origin["port"], ssl_context=context).start()
        runners.append(runner)
    raw_log = directory / "raw.log"

    async def banner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with raw_log.open("a") as log:
            log.write(f"{writer.get_extra_info('peername')[0]}\n")
        writer.write(b"SSH-2.0-world\r\n")
        await writer.drain()
        writer.close()

    raw_servers = [await asyncio.start_server(banner, raw["ip"], raw["port"]) for raw in config["raw"]]
    loop = asyncio.get_running_loop()
    for sink in config["udp"]:
        await loop.create_datagram_endpoint(
            lambda: _UdpSink(directory / "udp.log"), local_addr=(sink["ip"], sink["port"])
        )
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    (directory / "ready").write_text("ok")
    await stop.wait()
    for raw_server in raw_servers:
        raw_server.close()
    for runner in runners:
        await runner.cleanup()
    for server in servers:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
