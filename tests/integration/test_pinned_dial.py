"""`PinnedDial`, the dial that runs without a task: addresses in order, timeouts, cancellation, shutdown.

Real sockets on loopback: a listener that answers, an address where nothing listens (refused), and
a listener whose accept queue is full (the kernel drops the SYN, so a connect hangs). The
optimisation is held to the plain code: for the same target, `PinnedDial` chooses the same address
or fails with the same error as `open_pinned_connection` awaited in a task. The last tests run the
proxy in this process to see that a CONNECT's dial in flight is stopped by the listener's
shutdown and gives its tunnel reservation back, as the cancelled dialing task did.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from gateway.egress.connect import PinnedDial, open_pinned_connection
from gateway.egress.own_addresses import own_addresses
from gateway.egress.resolver import Resolver
from gateway.egress.target import EgressCore, PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.observe.audit import AuditLog
from gateway.policy.holder import PolicyHolder
from gateway.proxy.server import ProxyServer
from gateway.vet.urls import vet_host
from tests.harness.dns import FakeDNS
from tests.harness.origins import OriginFactory, unanswering_listener
from tests.harness.proxy import proxy_policy

WAIT_S = 5.0


class RecordingOwner:
    """A `DialOwner` that keeps every outcome it hears (a dial must report exactly once)."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[str, str | GatewayError | None]] = []
        self.reported = asyncio.Event()

    def dial_connected(self, transport: asyncio.Transport, protocol: asyncio.Protocol, address: str) -> None:
        self.outcomes.append(("connected", address))
        transport.close()
        self.reported.set()

    def dial_failed(self, error: GatewayError | None) -> None:
        self.outcomes.append(("failed", error))
        self.reported.set()


def _target(port: int, *ips: str) -> PinnedTarget:
    return PinnedTarget(vet_host("dial.example.org"), port, tuple(ipaddress.ip_address(ip) for ip in ips), 1, 0.0)


def _answering(ip: str, port: int = 0) -> socket.socket:
    listener = socket.socket()
    listener.bind((ip, port))
    listener.listen(8)
    return listener


@pytest.fixture
def unanswering(origins: OriginFactory) -> Iterator[socket.socket]:
    """A listener whose accept queue is full: further connects to it hang."""
    listener, fillers = unanswering_listener(origins.next_ip())
    yield listener
    for sock in [listener, *fillers]:
        sock.close()


class LoopTimer:
    """A `DialDeadline` on a loop timer, as the proxy's wheel entry is one (`ClientConnection`)."""

    def __init__(self, timeout_s: float) -> None:
        self.dial: PinnedDial[asyncio.Protocol] | None = None
        self._timeout_s = timeout_s  # what each attempt may take
        self._timer: asyncio.TimerHandle | None = None

    def start_dial_attempt(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self._timeout_s, self._expire)

    def end_dial_attempt(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.dial is not None:
            self.dial.attempt_timed_out()


async def _dial(target: PinnedTarget, timeout_s: float) -> tuple[PinnedDial[asyncio.Protocol], RecordingOwner]:
    owner = RecordingOwner()
    deadline = LoopTimer(timeout_s)
    dial = deadline.dial = PinnedDial(asyncio.get_running_loop(), target, asyncio.Protocol, owner, deadline)
    dial.start()
    return dial, owner


async def test_a_refused_address_is_skipped_and_the_next_one_answers(origins: OriginFactory) -> None:
    listener = _answering(origins.next_ip())
    ip, port = listener.getsockname()
    refusing = origins.next_ip()  # nothing listens there
    try:
        dial, owner = await _dial(_target(port, refusing, ip), timeout_s=WAIT_S)
        await asyncio.wait_for(owner.reported.wait(), WAIT_S)
        assert owner.outcomes == [("connected", ip)]
        assert dial.done
        assert dial.address == ip
    finally:
        listener.close()


async def test_every_address_refused_reports_the_last_failure_once(origins: OriginFactory) -> None:
    _, owner = await _dial(_target(9, origins.next_ip(), origins.next_ip()), timeout_s=WAIT_S)
    await asyncio.wait_for(owner.reported.wait(), WAIT_S)
    await asyncio.sleep(0.05)
    assert len(owner.outcomes) == 1, owner.outcomes
    kind, error = owner.outcomes[0]
    assert kind == "failed"
    assert isinstance(error, GatewayError)
    assert error.code == ErrorCode.CONNECT_FAILURE
    assert "refused" in error.message


async def test_an_attempt_that_gets_no_answer_times_out_and_the_next_address_answers(
    unanswering: socket.socket, origins: OriginFactory
) -> None:
    hanging_ip, port = unanswering.getsockname()
    listener = _answering(origins.next_ip(), port)
    try:
        _, owner = await _dial(_target(port, hanging_ip, listener.getsockname()[0]), timeout_s=0.2)
        await asyncio.wait_for(owner.reported.wait(), WAIT_S)
        assert owner.outcomes == [("connected", listener.getsockname()[0])]
    finally:
        listener.close()


async def test_a_cancelled_dial_reports_a_cancellation_once(unanswering: socket.socket) -> None:
    dial, owner = await _dial(_target(unanswering.getsockname()[1], unanswering.getsockname()[0]), timeout_s=WAIT_S)
    await asyncio.sleep(0.05)
    assert owner.outcomes == []
    dial.cancel()
    dial.cancel()  # asked twice before it stops: still one outcome
    await asyncio.wait_for(owner.reported.wait(), WAIT_S)
    assert owner.outcomes == [("failed", None)]
    assert dial.done
    dial.cancel()  # a finished dial ignores it
    dial.attempt_timed_out()
    await asyncio.sleep(0.1)
    assert owner.outcomes == [("failed", None)]


# ("connected", address) or ("failed", (code, message)).
Outcome = tuple[str, str | tuple[ErrorCode, str]]


async def _pinned_outcome(target: PinnedTarget, timeout_s: float) -> Outcome:
    _, owner = await _dial(target, timeout_s)
    await asyncio.wait_for(owner.reported.wait(), WAIT_S)
    assert len(owner.outcomes) == 1, owner.outcomes
    kind, result = owner.outcomes[0]
    if isinstance(result, GatewayError):
        return kind, (result.code, result.message)
    assert isinstance(result, str)
    return kind, result


async def _plain_outcome(target: PinnedTarget, timeout_s: float) -> Outcome:
    async def dial() -> Outcome:
        try:
            transport, _, address = await open_pinned_connection(target, asyncio.Protocol, timeout_s=timeout_s)
        except GatewayError as error:
            return "failed", (error.code, error.message)
        transport.close()
        return "connected", address

    return await asyncio.wait_for(asyncio.get_running_loop().create_task(dial()), WAIT_S)


# Each address of the target, in order: one that answers, one where nothing listens, one whose
# accept queue is full (the attempt times out).
@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (("answers", "hangs"), "connected"),
        (("refuses", "answers"), "connected"),
        (("hangs", "answers"), "connected"),
        (("refuses", "hangs", "answers"), "connected"),
        (("refuses", "refuses"), "failed"),
        (("hangs",), "failed"),
        (("refuses", "hangs"), "failed"),
        (("hangs", "refuses"), "failed"),
    ],
    ids=[
        "answering-first",
        "refused-then-answering",
        "unanswered-then-answering",
        "refused-unanswered-answering",
        "every-address-refused",
        "the-one-address-unanswered",
        "refused-then-unanswered",
        "unanswered-then-refused",
    ],
)
async def test_pinned_dial_gives_the_same_result_as_open_pinned_connection(
    unanswering: socket.socket, origins: OriginFactory, kinds: tuple[str, ...], expected: str
) -> None:
    hanging_ip, port = unanswering.getsockname()
    listener = _answering(origins.next_ip(), port)
    refusing = origins.next_ip()  # nothing listens there
    ips = {"answers": listener.getsockname()[0], "refuses": refusing, "hangs": hanging_ip}
    target = _target(port, *(ips[kind] for kind in kinds))
    try:
        pinned = await _pinned_outcome(target, timeout_s=0.3)
        plain = await _plain_outcome(target, timeout_s=0.3)
    finally:
        listener.close()
    assert pinned == plain
    assert pinned[0] == expected
    if expected == "connected":
        assert pinned[1] == ips["answers"]
    else:
        assert isinstance(pinned[1], tuple)
        code, message = pinned[1]
        assert code == ErrorCode.CONNECT_FAILURE
        last = kinds[-1]
        assert ("timed out" if last == "hangs" else "refused") in message


def _in_process_proxy(tmp_path: Path, fake_dns: FakeDNS, ip: str, port: int) -> tuple[ProxyServer, AuditLog]:
    policy_path = tmp_path / "policy.yaml"
    policy = proxy_policy([f"{ip}/32"], ports=[port], proxy={"connect_timeout_s": 30})
    policy_path.write_text(yaml.safe_dump(policy))
    holder = PolicyHolder(policy_path)
    core = EgressCore(Resolver([fake_dns.nameserver]), holder, own_addresses(["127.0.0.1"]))
    audit = AuditLog(str(tmp_path / "audit.log"))
    return ProxyServer(core, audit), audit


def _lines_for(tmp_path: Path, host: str) -> list[tuple[str, str | None, str | None]]:
    lines = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    return [
        (line["event"], line.get("decision"), line.get("close_reason")) for line in lines if line.get("host") == host
    ]


# The lines of a dial that connects during the drain: the allowed decision, then its close.
SHUTDOWN_LINES = [("decision", "allow", None), ("close", None, "shutdown")]


async def _send_connect(proxy: ProxyServer, authority: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    return reader, writer


async def _wait_until(condition: Callable[[], object]) -> None:
    """Poll `condition` until it holds or WAIT_S passes; the caller asserts what it expects."""
    loop = asyncio.get_running_loop()
    until = loop.time() + WAIT_S
    while not condition() and loop.time() < until:
        await asyncio.sleep(0.01)


async def test_a_dial_that_starts_after_the_listener_shut_down_is_stopped_too(
    tmp_path: Path, fake_dns: FakeDNS, unanswering: socket.socket
) -> None:
    # The CONNECT's DNS answer comes after the shutdown stopped the dials in flight: the dial
    # its task starts then is stopped as they were, not left to run.
    ip, port = unanswering.getsockname()
    fake_dns.add("slow-shutdown.example.org", ip, delay_s=0.5)
    proxy, audit = _in_process_proxy(tmp_path, fake_dns, ip, port)
    await proxy.start("127.0.0.1", 0)
    try:
        reader, writer = await _send_connect(proxy, f"slow-shutdown.example.org:{port}")
        await _wait_until(lambda: proxy.tunnels.reserved)
        assert proxy.tunnels.reserved == 1
        await proxy.close()
        assert not proxy.tunnels.dialing  # still resolving
        await _wait_until(lambda: not proxy.tunnels.reserved)
        assert proxy.tunnels.reserved == 0
        assert not proxy.tunnels.dialing
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
        writer.close()
    finally:
        await proxy.close()
        audit.close()
    assert _lines_for(tmp_path, "slow-shutdown.example.org") == SHUTDOWN_LINES


async def test_the_listener_shutdown_stops_a_connect_dial_in_flight_frees_its_reservation_and_audits_it(
    tmp_path: Path, fake_dns: FakeDNS, unanswering: socket.socket
) -> None:
    ip, port = unanswering.getsockname()
    fake_dns.add("hang-shutdown.example.org", ip)
    proxy, audit = _in_process_proxy(tmp_path, fake_dns, ip, port)
    await proxy.start("127.0.0.1", 0)
    try:
        reader, writer = await _send_connect(proxy, f"hang-shutdown.example.org:{port}")
        await _wait_until(lambda: proxy.tunnels.dialing)
        assert len(proxy.tunnels.dialing) == 1
        assert proxy.tunnels.reserved == 1
        await proxy.close()
        assert not proxy.tunnels.dialing
        assert proxy.tunnels.reserved == 0
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""  # closed without an answer
        writer.close()
    finally:
        await proxy.close()
        audit.close()
    assert _lines_for(tmp_path, "hang-shutdown.example.org") == SHUTDOWN_LINES
