"""The proxy's deadlines and half-closes as data: each limit a named case, no socket, no clock.

`proxy/deadlines/limits.py` decides; the listener, the tunnel and the upstream connection only
carry its verdicts out. The deadline wheel is driven here through `expire(now)` with explicit
times, so filing, moving, clearing and cancelling are checked without waiting for a timer.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.proxy.deadlines.limits import (
    AfterFin,
    ClientDeadline,
    ClientExpiry,
    ClientLimits,
    ResponseDeadlines,
    TunnelLimits,
)
from gateway.proxy.deadlines.wheel import TICK_S, DeadlineWheel, LazyDeadline

HEAD_S = 10.0
IDLE_S = 60.0

# --- the client connection: head deadline and keep-alive idle time --------------------------------


def _client(*steps: str) -> ClientLimits:
    """A client connection's deadlines after `steps` at t=0,1,2,... (accepted at t=0)."""
    deadlines = ClientLimits()
    deadlines.accepted(0.0, HEAD_S)
    for t, step in enumerate(steps, start=1):
        if step == "request":
            deadlines.request_started()
        elif step == "response":
            deadlines.response_finished(float(t), IDLE_S)
        elif step == "bytes":
            deadlines.bytes_arrived(float(t), HEAD_S)
    return deadlines


@pytest.mark.parametrize(
    ("steps", "at", "reason"),
    [
        pytest.param((), HEAD_S, ClientDeadline.HEAD, id="accepted-head-deadline"),
        pytest.param(("bytes",), HEAD_S, ClientDeadline.HEAD, id="partial-head-keeps-accept-deadline"),
        pytest.param(("request",), None, None, id="request-served-no-deadline-of-ours"),
        pytest.param(("request", "response"), 2 + IDLE_S, ClientDeadline.KEEP_ALIVE_IDLE, id="keep-alive-idle"),
        pytest.param(("request", "response", "bytes"), 3 + HEAD_S, ClientDeadline.HEAD, id="next-head-slowloris"),
        pytest.param(
            ("request", "response", "bytes", "bytes"), 3 + HEAD_S, ClientDeadline.HEAD, id="head-deadline-not-moved"
        ),
    ],
)
def test_client_deadline_follows_the_connection_phase(
    steps: tuple[str, ...], at: float | None, reason: ClientDeadline | None
) -> None:
    deadlines = _client(*steps)
    assert (deadlines.at, deadlines.reason) == (at, reason)


@pytest.mark.parametrize(
    ("steps", "now", "busy", "expiry"),
    [
        pytest.param((), HEAD_S, False, ClientExpiry.ABORT, id="slowloris-aborted"),
        pytest.param((), HEAD_S - 0.01, False, None, id="head-not-yet-due"),
        pytest.param(("request", "response"), 2 + IDLE_S, False, ClientExpiry.CLOSE, id="idle-closed-gracefully"),
        pytest.param(("request", "response"), 2 + IDLE_S, True, None, id="busy-connection-not-closed"),
        pytest.param(("request",), 1e9, False, None, id="nothing-due-while-served"),
    ],
)
def test_client_deadline_expiry(steps: tuple[str, ...], now: float, busy: bool, expiry: ClientExpiry | None) -> None:
    assert _client(*steps).expired(now, busy=busy) is expiry


def test_client_deadline_fires_once() -> None:
    deadlines = _client()
    assert deadlines.expired(HEAD_S, busy=False) is ClientExpiry.ABORT
    assert deadlines.expired(HEAD_S + 1, busy=False) is None
    assert deadlines.at is None


@pytest.mark.parametrize(
    ("owed", "after"),
    [
        pytest.param(True, AfterFin.HALF_CLOSE, id="fin-after-request-response-still-sent"),
        pytest.param(False, AfterFin.CLOSE, id="fin-between-requests-closes"),
    ],
)
def test_client_half_close(owed: bool, after: AfterFin) -> None:
    limits = ClientLimits()
    assert limits.client_eof(response_owed=owed) is after
    assert limits.eof


@pytest.mark.parametrize(
    ("request_keep_alive", "response_keep_alive", "body_done", "eof", "draining", "keep"),
    [
        pytest.param(True, True, True, False, False, True, id="keep-alive"),
        pytest.param(False, True, True, False, False, False, id="request-asked-to-close"),
        pytest.param(True, False, True, False, False, False, id="response-closes-client"),
        pytest.param(True, True, False, False, False, False, id="body-not-consumed-out-of-sync"),
        pytest.param(True, True, True, True, False, False, id="client-half-closed"),
        pytest.param(True, True, True, False, True, False, id="draining"),
    ],
)
def test_client_keep_alive_after_a_response(
    request_keep_alive: bool, response_keep_alive: bool, body_done: bool, eof: bool, draining: bool, keep: bool
) -> None:
    limits = ClientLimits()
    if eof:
        limits.client_eof(response_owed=True)
    assert limits.keep_alive(request_keep_alive, response_keep_alive, body_done, draining) is keep


# --- a tunnel: idle time, lifetime, half-closes ---------------------------------------------------


@pytest.mark.parametrize(
    ("idle_s", "lifetime_s", "activity", "now", "reason", "at"),
    [
        pytest.param(5.0, 100.0, 0.0, 4.9, None, 5.0, id="idle-not-yet"),
        pytest.param(5.0, 100.0, 0.0, 5.0, "idle_timeout", 5.0, id="idle-timeout"),
        pytest.param(5.0, 100.0, 3.0, 5.0, None, 8.0, id="activity-moves-idle-on"),
        pytest.param(5.0, 7.0, 4.0, 7.0, "max_lifetime", 7.0, id="lifetime-beats-activity"),
        pytest.param(5.0, 7.0, 6.5, 8.0, "max_lifetime", 7.0, id="lifetime-wins-when-both-passed"),
    ],
)
def test_tunnel_limits(
    idle_s: float, lifetime_s: float, activity: float, now: float, reason: str | None, at: float
) -> None:
    limits = TunnelLimits(0.0, idle_s, lifetime_s)
    limits.last_activity = activity
    assert limits.expired(now) == reason
    assert limits.at == at


@pytest.mark.parametrize(
    ("events", "ends"),
    [
        pytest.param([("client", True, True)], [AfterFin.HALF_CLOSE], id="client-fin-half-closes-upstream"),
        pytest.param([("upstream", True, True)], [AfterFin.HALF_CLOSE], id="upstream-fin-half-closes-client"),
        pytest.param(
            [("client", True, True), ("upstream", True, True)],
            [AfterFin.HALF_CLOSE, AfterFin.CLOSE],
            id="second-fin-closes",
        ),
        pytest.param([("client", False, True)], [AfterFin.CLOSE], id="fin-before-sni-check-closes"),
        pytest.param([("client", True, False)], [AfterFin.CLOSE], id="upstream-cannot-half-close"),
        pytest.param([("upstream", True, False)], [AfterFin.CLOSE], id="client-cannot-half-close"),
    ],
)
def test_tunnel_half_close(events: list[tuple[str, bool, bool]], ends: list[AfterFin]) -> None:
    limits = TunnelLimits(0.0, 60.0, 3600.0)
    seen = []
    for side, checked, other_can in events:
        if side == "client":
            seen.append(limits.client_eof(handshake_checked=checked, upstream_can_half_close=other_can))
        else:
            seen.append(limits.upstream_eof(client_can_half_close=other_can))
    assert seen == ends


# --- a forwarded response: silence, head, total -----------------------------------------------------


@pytest.mark.parametrize(
    ("activity", "now", "head_sent", "paused", "at", "message"),
    [
        pytest.param(0.0, 1.0, False, False, 3.0, None, id="waiting-for-head"),
        pytest.param(0.0, 3.0, False, False, None, "no response head within", id="head-timeout-504"),
        pytest.param(2.5, 3.0, False, False, None, "no response head within", id="dripping-head-still-times-out"),
        pytest.param(2.5, 3.0, True, False, 7.5, None, id="head-sent-idle-moves-on"),
        pytest.param(2.0, 7.0, True, False, None, "sent nothing for 5 s", id="upstream-silent"),
        pytest.param(2.0, 7.0, True, True, 12.0, None, id="paused-by-slow-client-not-silence"),
        pytest.param(19.0, 20.0, True, False, None, "within proxy.response_timeout_s (20 s)", id="total-timeout"),
    ],
)
def test_response_deadlines(
    activity: float, now: float, head_sent: bool, paused: bool, at: float | None, message: str | None
) -> None:
    deadlines = ResponseDeadlines()
    assert deadlines.start(0.0, 5.0, 3.0, 20.0) == 3.0
    deadlines.last_activity = activity
    got_at, got_message = deadlines.expired(now, head_sent=head_sent, reading_paused=paused)
    assert got_at == at
    if message is None:
        assert got_message is None
    else:
        assert got_message is not None
        assert message in got_message


# --- the wheel: one timer, entries filed by slot ----------------------------------------------------


class _Fired:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


async def test_wheel_fires_a_passed_deadline_once_and_never_early() -> None:
    wheel = DeadlineWheel()
    fired = _Fired()
    entry = LazyDeadline(fired, wheel)
    entry.set_at(1000.0)
    wheel.expire(1000.0 - TICK_S / 2)
    assert fired.count == 0
    wheel.expire(1000.0 + TICK_S)
    wheel.expire(1000.0 + 2 * TICK_S)
    assert fired.count == 1
    assert len(wheel) == 0
    wheel.close()


async def test_wheel_moved_later_is_filed_again_for_the_time_left() -> None:
    wheel = DeadlineWheel()
    fired = _Fired()
    entry = LazyDeadline(fired, wheel)
    entry.set_at(1000.0)
    entry.set_at(1005.0)  # later: only recorded, the entry stays in its earlier slot
    wheel.expire(1001.0)
    assert fired.count == 0
    assert entry.slot is not None  # filed again for 1005
    wheel.expire(1005.0 + TICK_S)
    assert fired.count == 1
    wheel.close()


async def test_wheel_moved_earlier_fires_at_the_earlier_time() -> None:
    wheel = DeadlineWheel()
    fired = _Fired()
    entry = LazyDeadline(fired, wheel)
    entry.set_at(1005.0)
    entry.set_at(1000.0)
    wheel.expire(1000.0 + TICK_S)
    assert fired.count == 1
    wheel.expire(1010.0)
    assert fired.count == 1  # the stale later slot finds nothing
    wheel.close()


@pytest.mark.parametrize("how", ["clear", "cancel"])
async def test_wheel_cleared_or_cancelled_entry_does_not_fire(how: str) -> None:
    wheel = DeadlineWheel()
    fired = _Fired()
    entry = LazyDeadline(fired, wheel)
    entry.set_at(1000.0)
    getattr(entry, how)()
    if how == "cancel":
        assert len(wheel) == 0  # the wheel holds no reference to a closed connection
    wheel.expire(1010.0)
    assert fired.count == 0
    wheel.close()


async def test_wheel_one_failing_callback_does_not_stop_the_others() -> None:
    wheel = DeadlineWheel()
    fired = _Fired()

    def broken() -> None:
        raise RuntimeError("boom")

    errors: list[object] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: errors.append(context["exception"]))
    try:
        LazyDeadline(broken, wheel).set_at(1000.0)
        LazyDeadline(fired, wheel).set_at(1000.0)
        wheel.expire(1001.0)
    finally:
        loop.set_exception_handler(None)
    assert fired.count == 1
    assert len(errors) == 1
    wheel.close()
