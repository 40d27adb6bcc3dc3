"""A finished tunnel is freed by reference counting: it leaves no cycle for the garbage collector.

The proxy runs in this process (the wiring `bench/proxy.py` uses: policy file, resolver against the
fake DNS, egress core, audit log), so the objects a tunnel leaves behind can be looked at. Cyclic
garbage per tunnel is what the collector walks at thousands of tunnels a second.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import yaml
from aiohttp import web

from gateway.egress import connect
from gateway.egress.own_addresses import own_addresses
from gateway.egress.resolver import Resolver
from gateway.egress.target import EgressCore
from gateway.observe.audit import AuditLog
from gateway.policy.holder import PolicyHolder
from gateway.proxy import client_connection
from gateway.proxy.deadlines import wheel as deadline
from gateway.proxy.server import ProxyServer
from gateway.proxy.tunnel import splice as tunnel
from tests.harness.dns import FakeDNS
from tests.harness.origins import OriginFactory
from tests.harness.proxy import proxy_policy

# The types the CONNECT path of this change owns; none may be left in a cycle.
TUNNEL_TYPES = (
    client_connection.ClientConnection,
    tunnel.Tunnel,
    tunnel.UpstreamTunnelProtocol,
    deadline.LazyDeadline,
    connect.PinnedDial,
)
SETTLE_S = 5.0


async def _tunnel_once(proxy: ProxyServer, authority: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert b" 200 " in head.split(b"\r\n", 1)[0], head
    writer.close()
    await writer.wait_closed()
    loop = asyncio.get_running_loop()
    settle_by = loop.time() + SETTLE_S
    while (proxy.connections or proxy.tunnels.tunnels) and loop.time() < settle_by:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the upstream side's connection_lost


async def test_a_closed_tunnel_leaves_no_reference_cycle(
    tmp_path: Path, fake_dns: FakeDNS, origins: OriginFactory
) -> None:
    origin = origins.start(web.Application(), names=("docs.example.org",), tls=False)
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(proxy_policy([origin.cidr], ports=[origin.port])))
    holder = PolicyHolder(policy_path)
    core = EgressCore(Resolver([fake_dns.nameserver]), holder, own_addresses(["127.0.0.1"]))
    audit = AuditLog(str(tmp_path / "audit.log"))
    proxy = ProxyServer(core, audit)
    await proxy.start("127.0.0.1", 0)
    authority = f"docs.example.org:{origin.port}"
    try:
        await _tunnel_once(proxy, authority)  # DNS answered and cached, caches warm
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(3):
                await _tunnel_once(proxy, authority)
            gc.collect()
            left = sorted({type(item).__qualname__ for item in gc.garbage if isinstance(item, TUNNEL_TYPES)})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert left == [], f"left in reference cycles: {left}"
    finally:
        await proxy.close()
        audit.close()
