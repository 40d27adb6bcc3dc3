"""The seam between search and the network: request and reply values, transport and cache protocols.

Engines build `EngineRequest` values and read `EngineReply` values; the aggregator hands requests
to a `Transport` (wired by the egress core to its guarded client, redirects not followed) and keeps
answers in a `SearchCache` (wired to the budget store). Nothing here opens a socket or resolves a
name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One HTTP request an engine wants sent; built by a pure function, sent by the transport."""

    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes | None = None

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        for key, value in self.headers:
            if key.lower() == wanted:
                return value
        return None


@dataclass(frozen=True, slots=True)
class EngineReply:
    """What came back: status, headers (keys stored lowercased), body and the final URL."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    url: str

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def content_type(self) -> str:
        return (self.header("content-type") or "").split(";", 1)[0].strip().lower()

    def text(self) -> str:
        # Engines answer in UTF-8; a stray byte must not make a parser crash on an otherwise
        # readable page.
        return self.body.decode("utf-8", errors="replace")


def make_reply(
    status: int, headers: Iterable[tuple[str, str]] | Mapping[str, str], body: bytes, url: str
) -> EngineReply:
    """Build a reply with lowercased header names so lookups are case-insensitive (RFC 9110 5.1)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    return EngineReply(status=status, headers={k.lower(): v for k, v in pairs}, body=body, url=url)


class Transport(Protocol):
    """Sends one request with no redirects followed.

    Raises `gateway.errors.GatewayError` (dns_failure, connect_failure, timeout, too_large,
    blocked_destination, ...) when no HTTP answer was obtained; any HTTP answer, error statuses
    included, is returned as an `EngineReply`.
    """

    async def __call__(self, request: EngineRequest, *, deadline_s: float) -> EngineReply: ...


class SearchCache(Protocol):
    """A byte store with per-entry TTL: memory by default, the shared store with Redis."""

    async def get(self, key: str) -> bytes | None: ...

    async def set(self, key: str, value: bytes, ttl_s: float) -> None: ...
