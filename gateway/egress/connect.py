"""Pinned TCP and TLS connections to addresses a `PinnedTarget` vetted.

TLS keeps SNI and certificate hostname verification against the original name while the socket
goes to the pinned address; trust is certifi plus the operator's extra bundle, TLS 1.2 minimum.
A tunnel's dial (`PinnedDial`: CONNECT and transparent alike) runs without a task and reports to
its owner, each attempt bounded by its caller's `DialDeadline`; callers that run in a task of
their own (and TLS upstreams) await `open_pinned_connection`, each attempt bounded by
`timeout_s`. Both try the addresses in order and fail as `connect_failure`, and give the same
result for the same target (the address chosen, or the error; tests/integration/test_pinned_dial.py
holds them to it). This module never resolves a name: it only dials IP addresses it is handed.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

import certifi
from aiohttp.abc import AbstractResolver, ResolveResult

from gateway.egress.dial_deadline import DialDeadline
from gateway.egress.io_errors import io_error
from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError

P = TypeVar("P", bound=asyncio.BaseProtocol)
P_contra = TypeVar("P_contra", bound=asyncio.BaseProtocol, contravariant=True)


def build_ssl_context(extra_ca_bundle: str | None) -> ssl.SSLContext:
    """Verify against certifi plus an optional operator bundle; never below TLS 1.2."""
    context = ssl.create_default_context(cafile=certifi.where())
    if extra_ca_bundle:
        _load_extra_bundle(context, extra_ca_bundle)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def _load_extra_bundle(context: ssl.SSLContext, extra_ca_bundle: str) -> None:
    try:
        context.load_verify_locations(cafile=extra_ca_bundle)
    except (OSError, ssl.SSLError) as exc:
        raise GatewayError(
            ErrorCode.INVALID_INPUT, f"EGRESS_CA_BUNDLE {extra_ca_bundle!r} cannot be loaded: {exc}"
        ) from None


class TlsTrust:
    """The guarded client's TLS context, built on its first use rather than at start.

    certifi's ~140 roots cost ~20 ms of CPU and ~0.7 MB, which a gateway that only proxies (a
    tunnel never terminates TLS) would pay for nothing. The operator's extra bundle is still
    loaded here, at start, so a bad EGRESS_CA_BUNDLE stops the daemon before it is ready. The
    build runs in a thread (OpenSSL reads the files without the GIL), so the loop never waits on it.
    """

    def __init__(self, extra_ca_bundle: str | None) -> None:
        self._extra_ca_bundle = extra_ca_bundle
        if extra_ca_bundle:
            _load_extra_bundle(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), extra_ca_bundle)
        self._context: ssl.SSLContext | None = None
        self._building: asyncio.Future[ssl.SSLContext] | None = None

    async def context(self) -> ssl.SSLContext:
        if self._context is None:
            if self._building is None:
                loop = asyncio.get_running_loop()
                self._building = loop.run_in_executor(None, build_ssl_context, self._extra_ca_bundle)
            try:
                # Shielded: a caller cancelled while it waits must not cancel the others' build.
                self._context = await asyncio.shield(self._building)
            except GatewayError as exc:
                self._building = None  # the bundle went bad after start: the next call tries again
                raise GatewayError(ErrorCode.CONNECT_FAILURE, f"no TLS trust store: {exc.message}") from None
        return self._context


class DialOwner(Protocol[P_contra]):
    """Hears once how a `PinnedDial` ended."""

    def dial_connected(self, transport: asyncio.Transport, protocol: P_contra, address: str) -> None: ...

    def dial_failed(self, error: GatewayError | None) -> None:
        """Every address failed (`error`: how the last one did), or None: the dial was cancelled."""
        ...


class PinnedDial(Generic[P]):
    """One dial of a `PinnedTarget`: its vetted addresses in order, each attempt bounded by a
    `DialDeadline`, the first that answers handed to the owner (or the last failure).

    No task: uvloop's `create_connection` is a coroutine, stepped here from its waiter's done
    callback, as a Task would step it. A tunnel's dial then costs no Task, no registration of one
    in asyncio's task set, no done callback and no coroutine frames of ours resumed on each step:
    about 20 k instructions per tunnel less than a task awaiting `open_pinned_connection`
    (2026-12-02, bench/README.md "Structure"). Whoever starts a dial keeps a reference to it until
    the owner hears the outcome (the tunnel opener's `dialing` set, which its listener's shutdown
    cancels), and `cancel` stops it as a Task is cancelled: the half-made connection is closed by
    the loop's own handler for the CancelledError at its await.
    """

    __slots__ = (
        "_cancelled",
        "_coro",
        "_deadline",
        "_factory",
        "_last",
        "_loop",
        "_next",
        "_owner",
        "_timed_out",
        "_waiter",
        "address",
        "started",
        "target",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        target: PinnedTarget,
        protocol_factory: Callable[[], P],
        owner: DialOwner[P],
        deadline: DialDeadline,
    ) -> None:
        self._loop = loop
        self.target = target
        self._factory = protocol_factory
        self._owner: DialOwner[P] | None = owner
        self._deadline: DialDeadline | None = deadline
        self._next = 0  # the index of the next address to try
        self._coro: Coroutine[Any, Any, tuple[asyncio.Transport, P]] | None = None
        self._waiter: asyncio.Future[Any] | None = None
        self._last: GatewayError | None = None
        self._timed_out = False
        self._cancelled = False
        self.address = ""  # the address being tried, then the one that answered
        # For the caller's connect-latency metric: a dial is started as soon as it is made.
        self.started = time.perf_counter()

    @property
    def done(self) -> bool:
        return self._owner is None

    def attempt_timed_out(self) -> None:
        """`DialDeadline`: the attempt running took longer than it may; the next address is tried."""
        if self._waiter is not None and not self._cancelled:
            self._timed_out = True
            self._interrupt()

    def cancel(self) -> None:
        """Stop: the connection being made is closed and, on the loop's next iteration, the owner
        hears `dial_failed(None)`."""
        if self._waiter is not None:
            self._cancelled = True
            self._interrupt()

    def _interrupt(self) -> None:
        # As a Task is cancelled: the waiter now (uvloop sets no result on a cancelled one), the
        # coroutine from the waiter's done callback, with CancelledError thrown in at its await.
        # Not resumed at once: the callbacks a cancellation schedules (stdlib asyncio's removal of
        # the socket's writer) must run before the socket closes and the next attempt's socket
        # reuses its descriptor.
        assert self._waiter is not None
        self._waiter.cancel()

    def _try_next(self) -> None:
        """The next address (the first: `start`), or the last failure once none is left."""
        texts = self.target.address_texts
        if self._next >= len(texts):
            last = self._last
            assert last is not None
            self._finish().dial_failed(last)
            return
        text = self.address = texts[self._next]
        self._next += 1
        self._timed_out = False
        assert self._deadline is not None
        self._deadline.start_dial_attempt()
        self._coro = self._loop.create_connection(self._factory, host=text, port=self.target.port)
        self._step(None)

    start = _try_next

    def _step(self, _waiter: asyncio.Future[Any] | None) -> None:
        coro = self._coro
        assert coro is not None
        assert self._deadline is not None
        self._waiter = None
        try:
            # The future the coroutine awaits next, or its result as StopIteration. Interrupted,
            # it gets CancelledError even if its waiter finished first (as a cancelled Task does):
            # the connection it made is then closed by uvloop's handler.
            interrupted = self._cancelled or self._timed_out
            waiter = coro.throw(asyncio.CancelledError()) if interrupted else coro.send(None)
            waiter.add_done_callback(self._step)
        except StopIteration as connected:
            self._deadline.end_dial_attempt()
            transport, protocol = connected.value
            # asyncio and uvloop already set TCP_NODELAY on every TCP transport they create.
            self._finish().dial_connected(transport, protocol, self.address)
            return
        except asyncio.CancelledError:
            self._deadline.end_dial_attempt()
            if self._cancelled or not self._timed_out:
                self._finish().dial_failed(None)
                return
            self._last = _timed_out(self.target)
        except OSError as exc:
            self._deadline.end_dial_attempt()
            self._last = io_error(exc, self.target)
        except BaseException:
            # Not a failure to connect (a defect, or the interpreter stopping): the owner hears a
            # cancellation, and the exception goes on to the loop's handler.
            self._deadline.end_dial_attempt()
            self._finish().dial_failed(None)
            raise
        else:
            self._waiter = waiter
            return
        self._try_next()

    def _finish(self) -> DialOwner[P]:
        """Let go of everything the dial holds (its owner holds it: no cycle is left), once."""
        owner = self._owner
        assert owner is not None
        self._owner = None
        self._coro = None
        self._deadline = None
        return owner


class _TaskTimer:
    """The per-attempt timeout of `open_pinned_connection`: one loop timer that cancels the task."""

    __slots__ = ("_task", "_timer", "timed_out")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task
        self._timer: asyncio.TimerHandle | None = None
        self.timed_out = False

    def start(self, timeout_s: float) -> None:
        self.timed_out = False
        self._timer = self._task.get_loop().call_later(timeout_s, self._expire)

    def end(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        self.timed_out = True
        self._task.cancel()


async def open_pinned_connection(
    target: PinnedTarget,
    protocol_factory: Callable[[], P],
    *,
    timeout_s: float,
    tls: ssl.SSLContext | None = None,
) -> tuple[asyncio.Transport, P, str]:
    """Dial the vetted addresses in order; return the first that answers and the address used.

    Each address gets `timeout_s` (a loop timer), the TLS handshake included when `tls` is
    given (then verified for the target's name). For callers that run in a task of their own (the
    forward dispatcher's fresh connections, inspected upstreams): they await uvloop's
    `create_connection` directly. Awaiting a `PinnedDial` instead would add a wake-up per dial
    (the dial's callback, then the task's): 67.5 → 87.4 k instructions per dial, measured.
    """
    task = asyncio.current_task()
    assert task is not None, "dial from a task: the timeout cancels it"
    loop = task.get_loop()
    timer = _TaskTimer(task)
    last: GatewayError | None = None
    for text in target.address_texts:
        # A cancellation of this task rather than an `asyncio.timeout` block: the same outcome
        # with no context object.
        cancelling = task.cancelling()
        timer.start(timeout_s)
        try:
            if tls is None:
                transport, protocol = await loop.create_connection(protocol_factory, host=text, port=target.port)
            else:
                # TLS to the vetted address, verified for the name it was vetted as (an inspected
                # host's upstream: the gateway's own trust store, never the interception CA).
                transport, protocol = await loop.create_connection(
                    protocol_factory, host=text, port=target.port, ssl=tls, server_hostname=target.name
                )
        except asyncio.CancelledError:
            # Ours only if the deadline passed and no one else asked for cancellation too.
            if not timer.timed_out or task.uncancel() > cancelling:
                raise
            last = _timed_out(target)
            continue
        except OSError as exc:
            last = io_error(exc, target)
            continue
        finally:
            timer.end()
        # asyncio and uvloop already set TCP_NODELAY on every TCP transport they create.
        return transport, protocol, text
    assert last is not None
    raise last


def _timed_out(target: PinnedTarget) -> GatewayError:
    return GatewayError(ErrorCode.CONNECT_FAILURE, f"connection to {target.name}:{target.port} timed out")


class PinnedResolver(AbstractResolver):
    """An aiohttp resolver that can only answer the one name it was pinned to.

    aiohttp then dials the vetted address but still sends SNI and verifies the certificate for
    the URL's host, which is the original name.
    """

    def __init__(self, target: PinnedTarget) -> None:
        self.target = target

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host != self.target.name:
            raise OSError(f"pinned resolver asked for {host!r}, pinned to {self.target.name!r}")
        results: list[ResolveResult] = []
        for address in self.target.addresses:
            results.append(
                {
                    "hostname": host,
                    "host": str(address),
                    "port": port,
                    "family": socket.AF_INET6 if address.version == 6 else socket.AF_INET,
                    "proto": 0,
                    "flags": socket.AI_NUMERICHOST,
                }
            )
        return results

    async def close(self) -> None:
        return None
