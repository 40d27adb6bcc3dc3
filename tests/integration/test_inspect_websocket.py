"""WebSocket upgrades inside an inspected connection (issue 25: "judged by the rules, then
relayed"), through the real daemon: aiohttp's WebSocket client trusting the interception CA only
through its SSL context, a loopback TLS aiohttp WebSocket echo origin, the fake DNS.

Covers: an allowed upgrade echoes text and binary messages both ways and its close line counts
the bytes; an upgrade the rules deny is refused (403, audit line) and never reaches the origin;
an origin's non-101 answer is relayed as a normal response; an upgrade carrying a body is
refused as `inspection_unsupported`; SIGTERM's drain waits for an open relay (it keeps echoing
through the grace) and the daemon exits once the agent closes it."""

from __future__ import annotations

import asyncio
import signal
import ssl
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.harness.inspection import (
    API,
    InspectingGateway,
    InspectingGatewayFactory,
    InterceptionCA,
    inspect_policy,
    tls_through,
)
from tests.harness.origins import Origin, OriginFactory
from tests.harness.proxy import read_head


class EchoOrigin:
    """A WebSocket echo origin that counts every upgrade request it sees, by path."""

    def __init__(self) -> None:
        self.upgrades: list[str] = []

    def app(self) -> web.Application:
        async def socket(request: web.Request) -> web.StreamResponse:
            self.upgrades.append(request.path)
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    await ws.send_str("echo:" + message.data)
                elif message.type == aiohttp.WSMsgType.BINARY:
                    await ws.send_bytes(message.data[::-1])
            return ws

        async def plain(request: web.Request) -> web.Response:
            self.upgrades.append(request.path)
            return web.Response(status=404, text="no socket here")

        app = web.Application()
        app.router.add_get("/socket", socket)
        app.router.add_get("/admin/socket", socket)
        app.router.add_get("/plain", plain)
        return app


def _policy(origin: Origin, **proxy: Any) -> dict[str, Any]:
    rules = {"access": "read-only", "deny": [{"id": "no-admin", "paths": ["/admin/**"]}]}
    return inspect_policy(origin, rules, proxy=proxy or None)


@pytest.fixture
def echo(origins: OriginFactory) -> tuple[EchoOrigin, Origin]:
    counter = EchoOrigin()
    return counter, origins.start(counter.app(), names=(API,))


def _client_context(ca: InterceptionCA) -> ssl.SSLContext:
    # Our CA only: the agent reaches the origin through the gateway's leaf or not at all.
    return ssl.create_default_context(cafile=str(ca.ca_only))


async def _let_tls_close() -> None:
    """aiohttp closes a proxied TLS connection's socket only after its TLS shutdown, on later
    loop iterations; `asyncio.run` ending first leaves the socket to the garbage collector
    (a ResourceWarning pytest reports in a later test). aiohttp's documented workaround
    ("Graceful Shutdown"): give the loop a moment after the session closes."""
    await asyncio.sleep(0.25)


async def _exchange(gateway: InspectingGateway, ca: InterceptionCA, url: str) -> list[Any]:
    got: list[Any] = []
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session,
            session.ws_connect(url, proxy=gateway.proxy_url, ssl=_client_context(ca)) as ws,
        ):
            for text in ("hello", "x" * 70_000):  # the second spans several TLS records
                await ws.send_str(text)
                got.append((await ws.receive(timeout=10)).data)
            await ws.send_bytes(b"\x00\x01binary")
            got.append((await ws.receive(timeout=10)).data)
    finally:
        await _let_tls_close()
    return got


def test_an_allowed_websocket_upgrade_is_relayed_both_ways_and_audited(
    inspecting_gateway: InspectingGatewayFactory, interception_ca: InterceptionCA, echo: tuple[EchoOrigin, Origin]
) -> None:
    counter, origin = echo
    gateway = inspecting_gateway(_policy(origin))
    got = asyncio.run(_exchange(gateway, interception_ca, f"wss://{API}:{origin.port}/socket?room=1"))
    assert got == ["echo:hello", "echo:" + "x" * 70_000, b"yranib\x01\x00"]
    assert counter.upgrades == ["/socket"]
    lines = gateway.wait_audit(lambda ls: any(x.get("upgrade") == "websocket" for x in ls))
    (line,) = [x for x in lines if x.get("kind") == "inspect" and x.get("upgrade") == "websocket"]
    assert (line["method"], line["path"], line["status"], line["decision"]) == ("GET", "/socket", 101, "allow")
    assert line["rule"] == "inspect[0].access"
    # Both ways carry the 70 kB message (WebSocket framing and the heads come on top).
    assert line["bytes_up"] > 70_000
    assert line["bytes_down"] > 70_000
    assert line["outcome"] == "ok"


def test_a_denied_websocket_upgrade_never_reaches_the_origin(
    inspecting_gateway: InspectingGatewayFactory, interception_ca: InterceptionCA, echo: tuple[EchoOrigin, Origin]
) -> None:
    counter, origin = echo
    gateway = inspecting_gateway(_policy(origin))

    async def attempt() -> int:
        try:
            await _exchange(gateway, interception_ca, f"wss://{API}:{origin.port}/admin/socket")
        except aiohttp.WSServerHandshakeError as error:
            return error.status
        return 0

    assert asyncio.run(attempt()) == 403
    lines = gateway.wait_audit(lambda ls: any(x.get("rule") == "no-admin" for x in ls))
    denied = [x for x in lines if x.get("kind") == "inspect" and x.get("rule") == "no-admin"]
    assert [(x["method"], x["path"], x["code"]) for x in denied] == [("GET", "/admin/socket", "policy_denied")]
    assert counter.upgrades == []


def test_a_non_101_answer_is_relayed_as_a_normal_response(
    inspecting_gateway: InspectingGatewayFactory, interception_ca: InterceptionCA, echo: tuple[EchoOrigin, Origin]
) -> None:
    counter, origin = echo
    gateway = inspecting_gateway(_policy(origin))
    with tls_through(gateway, interception_ca, origin) as tls:
        tls.sendall(
            f"GET /plain HTTP/1.1\r\nHost: {API}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode()
        )
        answer = read_head(tls)
        while b"no socket here" not in answer:
            chunk = tls.recv(65536)
            if not chunk:
                break
            answer += chunk
        # The response ended: the gateway closes (nothing more of the agent's goes upstream).
        assert tls.recv(65536) == b""
    assert answer.startswith(b"HTTP/1.1 404"), answer
    assert b"no socket here" in answer
    assert counter.upgrades == ["/plain"]
    lines = gateway.wait_audit(lambda ls: any(x.get("upgrade") == "websocket" for x in ls))
    (line,) = [x for x in lines if x.get("upgrade") == "websocket"]
    assert (line["status"], line["close_reason"]) == (404, "done")


def test_an_upgrade_with_a_body_is_refused_plainly(
    inspecting_gateway: InspectingGatewayFactory, interception_ca: InterceptionCA, echo: tuple[EchoOrigin, Origin]
) -> None:
    counter, origin = echo
    gateway = inspecting_gateway(_policy(origin))
    with tls_through(gateway, interception_ca, origin) as tls:
        tls.sendall(
            f"GET /socket HTTP/1.1\r\nHost: {API}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            "Content-Length: 2\r\n\r\nhi".encode()
        )
        answer = read_head(tls)
    assert answer.startswith(b"HTTP/1.1 501"), answer
    assert b"X-Egress-Code: inspection_unsupported" in answer
    assert counter.upgrades == []


def _wait_until_draining(gateway: InspectingGateway, timeout_s: float = 10.0) -> None:
    """Until /readyz answers 503 (the drain has begun), rather than a fixed sleep."""
    deadline = time.monotonic() + timeout_s
    while gateway.readyz()[0] != 503:
        assert time.monotonic() < deadline, "the gateway never began draining"
        time.sleep(0.02)


def test_sigterm_drain_waits_for_an_open_websocket_relay(
    inspecting_gateway: InspectingGatewayFactory, interception_ca: InterceptionCA, echo: tuple[EchoOrigin, Origin]
) -> None:
    _, origin = echo
    gateway = inspecting_gateway(_policy(origin, drain_grace_s=30))
    process = gateway.process
    assert process is not None

    async def relay_through_the_drain() -> list[Any]:
        got: list[Any] = []
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session,
            session.ws_connect(
                f"wss://{API}:{origin.port}/socket",
                proxy=gateway.proxy_url,
                ssl=_client_context(interception_ca),
            ) as ws,
        ):
            await ws.send_str("before")
            got.append((await ws.receive(timeout=10)).data)
            gateway.signal(signal.SIGTERM)
            # Draining now, as readiness says; the relay keeps working in the grace.
            await asyncio.to_thread(_wait_until_draining, gateway)
            assert process.poll() is None, "the daemon left while an inspected relay was open"
            await ws.send_str("during")
            got.append((await ws.receive(timeout=10)).data)
        await _let_tls_close()
        return got

    assert asyncio.run(relay_through_the_drain()) == ["echo:before", "echo:during"]
    started = time.monotonic()
    # Well under the 30 s grace: the daemon leaves because the last relay closed.
    assert process.wait(15) == 0
    assert time.monotonic() - started < 15
    closes = [x for x in gateway.audit_lines() if x.get("upgrade") == "websocket"]
    assert [x["close_reason"] for x in closes] in (["client_closed"], ["upstream_closed"])
