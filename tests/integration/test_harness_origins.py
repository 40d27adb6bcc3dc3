"""The harness's own origins stop cleanly while a connection is still being accepted.

asyncio accepts a connection in one loop iteration and builds its transport in a task one
iteration later. An origin stopped in between (a tunnel dialed at the end of a test, the origin
torn down at once) used to leave a half-built transport, reported as an "unclosed transport"
error in whichever later test collected it, or hold the stop for aiohttp's 60 s shutdown timeout.
Each case here is the stop landing that many iterations after the connection arrived.
"""

from __future__ import annotations

import asyncio
import gc
import socket

import pytest
from aiohttp import web

from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.origins import HarnessLoop, OriginFactory, listening_socket, stop_serving

STOP_TIMEOUT_S = 10.0


@pytest.mark.parametrize("iterations", [0, 1, 2, 3], ids=lambda n: f"stop-after-{n}-iterations")
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_an_origin_stopped_while_accepting_leaves_no_half_built_transport(
    harness_loop: HarnessLoop, pki: TestPKI, iterations: int, tls: bool
) -> None:
    async def accept_and_stop() -> None:
        runner = web.AppRunner(web.Application(), access_log=None, handler_cancellation=True)
        await runner.setup()
        listener = listening_socket("127.0.0.1", 0)
        context = pki.server_context("docs.example.org") if tls else None
        await web.SockSite(runner, listener, ssl_context=context).start()
        # A loopback connect completes in the kernel at once; the loop has not accepted it yet.
        with socket.create_connection(listener.getsockname(), timeout=5):
            for _ in range(iterations):
                await asyncio.sleep(0)
            await asyncio.wait_for(stop_serving(runner, listener), STOP_TIMEOUT_S)

    harness_loop.run(accept_and_stop())
    # A transport left half-built is garbage now: collecting it warns, an error under the
    # suite's filterwarnings.
    gc.collect()


def test_loopback_addresses_come_back_when_a_test_ends(
    harness_loop: HarnessLoop, pki: TestPKI, fake_dns: FakeDNS
) -> None:
    # The suite starts more origins than 127.0.0.2-254 holds; three tests' worth of 200 each
    # must each get 200 distinct addresses, which the old one-way counter could not give.
    for _ in range(3):
        factory = OriginFactory(harness_loop, pki, fake_dns)
        taken = [factory.next_ip() for _ in range(200)]
        assert len(set(taken)) == 200
        factory.stop_all()
    holding = OriginFactory(harness_loop, pki, fake_dns)
    held = {holding.next_ip() for _ in range(100)}
    other = OriginFactory(harness_loop, pki, fake_dns)
    # While one test holds its addresses, another gets only addresses nobody holds.
    assert held.isdisjoint({other.next_ip() for _ in range(100)})
    other.stop_all()
    holding.stop_all()
