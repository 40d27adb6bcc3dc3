"""Pinned TCP and TLS connections to addresses a `PinnedTarget` vetted.

TLS keeps SNI and certificate hostname verification against the original name while the socket
goes to the pinned address; trust is certifi plus the operator's extra bundle, TLS 1.2 minimum.
This module never resolves a name: it only dials IP addresses it is handed.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from typing import TypeVar

import certifi
from aiohttp.abc import AbstractResolver, ResolveResult

from gateway.egress.dial_deadline import DialDeadline, LoopTimerDeadline
from gateway.egress.io_errors import io_error
from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError

P = TypeVar("P", bound=asyncio.BaseProtocol)


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


async def open_pinned_connection(
    target: PinnedTarget,
    protocol_factory: Callable[[], P],
    *,
    timeout_s: float,
    deadline: DialDeadline | None = None,
) -> tuple[asyncio.Transport, P, str]:
    """Dial the vetted addresses in order; return the first that answers and the address used.

    Each address gets `timeout_s`, kept by `deadline` (the caller's own timer, which cancels this
    task when an attempt's time passes) or else by a loop timer.
    """
    if deadline is None:
        current = asyncio.current_task()
        assert current is not None, "dial from a task: the timeout cancels it"
        deadline = LoopTimerDeadline(current)
    task = deadline.dialing_task
    loop = task.get_loop()
    last: GatewayError | None = None
    for text in target.address_texts:
        # A cancellation of this task rather than an `asyncio.timeout` block: the same outcome
        # with no context object, on the path of every tunnel setup.
        cancelling = task.cancelling()
        deadline.start_dial_attempt(timeout_s)
        try:
            transport, protocol = await loop.create_connection(protocol_factory, host=text, port=target.port)
        except asyncio.CancelledError:
            # Ours only if the deadline passed and no one else asked for cancellation too.
            if not deadline.dial_timed_out or task.uncancel() > cancelling:
                raise
            last = GatewayError(ErrorCode.CONNECT_FAILURE, f"connection to {target.name}:{target.port} timed out")
            continue
        except OSError as exc:
            last = io_error(exc, target)
            continue
        finally:
            deadline.end_dial_attempt()
        # asyncio and uvloop already set TCP_NODELAY on every TCP transport they create.
        return transport, protocol, text
    assert last is not None
    raise last


class PinnedResolver(AbstractResolver):
    """An aiohttp resolver that can only answer the one name it was pinned to.

    aiohttp then dials the vetted address but still sends SNI and verifies the certificate for
    the URL's host, which is the original name.
    """

    def __init__(self, target: PinnedTarget) -> None:
        self._target = target

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host != self._target.name:
            raise OSError(f"pinned resolver asked for {host!r}, pinned to {self._target.name!r}")
        results: list[ResolveResult] = []
        for address in self._target.addresses:
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
