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

from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError

P = TypeVar("P", bound=asyncio.BaseProtocol)


def build_ssl_context(extra_ca_bundle: str | None) -> ssl.SSLContext:
    """Verify against certifi plus an optional operator bundle; never below TLS 1.2."""
    context = ssl.create_default_context(cafile=certifi.where())
    if extra_ca_bundle:
        try:
            context.load_verify_locations(cafile=extra_ca_bundle)
        except (OSError, ssl.SSLError) as exc:
            raise GatewayError(
                ErrorCode.INVALID_INPUT, f"EGRESS_CA_BUNDLE {extra_ca_bundle!r} cannot be loaded: {exc}"
            ) from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def describe_connect_error(exc: BaseException, target: PinnedTarget) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate for {target.name} rejected: {exc.verify_message or exc.reason}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake with {target.name} failed: {exc.reason or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection to {target.name}:{target.port} refused"
    if isinstance(exc, TimeoutError):
        return f"connection to {target.name}:{target.port} timed out"
    return f"connection to {target.name}:{target.port} failed: {exc.__class__.__name__}"


async def open_pinned_connection(
    target: PinnedTarget,
    protocol_factory: Callable[[], P],
    *,
    timeout_s: float,
) -> tuple[asyncio.Transport, P, str]:
    """Dial the vetted addresses in order; return the first that answers and the address used."""
    loop = asyncio.get_running_loop()
    last: BaseException | None = None
    for address in target.addresses:
        try:
            async with asyncio.timeout(timeout_s):
                transport, protocol = await loop.create_connection(
                    protocol_factory, host=str(address), port=target.port
                )
        except (OSError, TimeoutError) as exc:
            last = exc
            continue
        # asyncio and uvloop already set TCP_NODELAY on every TCP transport they create.
        return transport, protocol, str(address)
    assert last is not None
    raise GatewayError(ErrorCode.CONNECT_FAILURE, describe_connect_error(last, target))


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
