"""The request half of a proxy client connection, without I/O: client bytes in, request events out.

Owns how the listener reads HTTP/1.1 requests, as a state object in the style of h11: llhttp
(httptools, strict: conflicting or duplicate framing, obs-fold, bare CR/LF, NUL and invalid
methods are refused by the parser itself), the request-head caps counted on raw bytes (URL, head
size, field count), the rules the proxy adds (a single `Transfer-Encoding: chunked` only, one
`Proxy-Authorization`, no `Connection` field naming a framing field, trailers dropped and
bounded, no protocol upgrade but CONNECT), pipelining (every request of a read comes out in
order) and the keep-alive intent of each request (RFC 9112 section 9.6: after a request that
asked to close, further bytes are dropped, not refused).

Each `feed` returns the events of that read: a request head (what the owner's `new_head` makes
of it), `RequestBody`, `RequestEnd`, `ConnectHead` (the rest of the read belongs to the tunnel),
or `Refusal` (answer it and close; nothing further is parsed). Never touches a socket or a
timer; the listener carries the events out and the transparent listener can reuse it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar, Union

import httptools

from gateway.errors import ErrorCode, GatewayError
from gateway.proxy.heads import (
    FRAMING_FIELDS,
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MAX_URL_BYTES,
    NOTHING_NAMED,
    FieldRoles,
    named_by_connection,
)

# What a complete request head (not CONNECT) becomes, made by the framing's owner from the parse:
# (method, url, headers, authorization, the header names its Connection field lists, chunked,
# HTTP/1.0, this request's own keep-alive intent, RFC 9112 section 9.3). The listener's is its
# `ForwardExchange`, so one object per request holds the parse and the exchange (no event record
# copied into a second one); the request's body and end follow it as events.
H = TypeVar("H")
HeadFactory = Callable[[bytes, bytes, list[tuple[bytes, bytes]], bytes | None, frozenset[bytes], bool, bool, bool], H]


@dataclass(slots=True)
class RequestBody:
    data: bytes


@dataclass(frozen=True, slots=True)
class RequestEnd:
    pass


@dataclass(slots=True)  # not frozen either: once per tunnel
class ConnectHead:
    """A CONNECT head; `rest` (bytes already read after it) belongs to the tunnel, not to HTTP."""

    authority: bytes
    authorization: bytes | None
    rest: bytes


@dataclass(frozen=True, slots=True)
class Refusal:
    """The stream cannot be served: answer `error` once and close (it is out of sync)."""

    error: GatewayError


UPGRADE_REFUSED = "protocol upgrades are not proxied; use CONNECT"
# `Union`: a generic alias (`RequestEvent[ForwardExchange]`), which `|` cannot spell with a TypeVar.
RequestEvent = Union[H, RequestBody, RequestEnd, ConnectHead, Refusal]  # noqa: UP007
_END = RequestEnd()


# What a request field's name means to the framing, remembered per name as sent (`FieldRoles`).
_OTHER, _AUTHORIZATION, _CONNECTION, _PROXY_CONNECTION, _TRANSFER_ENCODING = range(5)
_ROLE_OF_LOWERED = {
    b"proxy-authorization": _AUTHORIZATION,
    b"connection": _CONNECTION,
    b"proxy-connection": _PROXY_CONNECTION,
    b"transfer-encoding": _TRANSFER_ENCODING,
}


def _request_field_role(name: bytes) -> int:
    return _ROLE_OF_LOWERED.get(name.lower(), _OTHER)


_REQUEST_FIELD_ROLES = FieldRoles(_request_field_role)


class _HeadRefused(Exception):
    """Raised inside an httptools callback to stop parsing; the reason is on the framing."""


class RequestFraming(Generic[H]):
    """Requests of one client connection, parsed one read at a time; each head made by `new_head`."""

    __slots__ = (
        "_authorization",
        "_chunked",
        "_connect",
        "_connection_values",
        "_events",
        "_head_size",
        "_headers",
        "_in_head",
        "_new_head",
        "_no_more_requests",
        "_parser",
        "_proxy_connection",
        "_raw_head_bytes",
        "_refusal",
        "_url",
        "done",
    )

    def __init__(self, new_head: HeadFactory[H]) -> None:
        self._new_head = new_head
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._events: list[RequestEvent[H]] = []
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._authorization: bytes | None = None
        self._chunked = False
        self._connect = False  # the head was a CONNECT (no HTTP follows it)
        self._connection_values: list[bytes] = []
        self._proxy_connection = False  # the head has a Proxy-Connection field
        self._raw_head_bytes = 0
        self._head_size = 0
        self._in_head = True
        self._refusal: GatewayError | None = None
        self._no_more_requests = False
        self.done = False  # nothing more will be parsed (refused, tunnelled, or asked to close)

    @property
    def in_head(self) -> bool:
        """Between requests or inside a head (the head deadline applies), not inside a body."""
        return self._in_head

    def feed(self, data: bytes) -> list[RequestEvent[H]]:
        if self.done:
            return []
        events = self._events = []
        parser = self._parser
        assert parser is not None  # let go of only once done
        if self._in_head:
            self._raw_head_bytes += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._finish()
            if parser.get_method() != b"CONNECT":
                events.append(
                    Refusal(GatewayError(ErrorCode.INVALID_INPUT, "protocol upgrades are not proxied; use CONNECT"))
                )
            else:
                events.append(ConnectHead(self._url, self._authorization, data[upgrade.args[0] :]))
            return events
        except httptools.HttpParserError as exc:
            self._finish()
            if not self._no_more_requests:
                events.append(
                    Refusal(self._refusal or GatewayError(ErrorCode.INVALID_INPUT, f"malformed request: {exc}"))
                )
            # else RFC 9112 section 9.6: after a request that asked to close, further requests are
            # not processed; it is still owed its response, so the bytes are dropped, not refused.
            return events
        if self._no_more_requests:
            self._finish()
        elif self._in_head and self._raw_head_bytes > MAX_HEAD_BYTES:
            self._finish()
            events.append(Refusal(GatewayError(ErrorCode.TOO_LARGE, "the request head is too large", status=431)))
        return events

    def _finish(self) -> None:
        """Nothing more is parsed: the parser is let go of. It holds this object's callbacks, a
        reference cycle the garbage collector would otherwise have to find (once per tunnel)."""
        self.done = True
        self._parser = None

    def _refuse(self, error: GatewayError) -> None:
        self._refusal = error
        raise _HeadRefused

    # httptools callbacks ------------------------------------------------------------------------
    # No `on_message_begin` (a Python call per request): a head's state starts empty, set so by
    # `__init__` and again once each head is complete, and once each message ends for its size.

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if len(self._url) > MAX_URL_BYTES:
            self._refuse(GatewayError(ErrorCode.TOO_LARGE, "the request line is too long", status=431))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        if not self._in_head:
            # A trailer field (after a chunked body): never merged into the head that already went
            # upstream or is about to, only bounded. The forwarded body ends with no trailers.
            if self._head_size > MAX_HEAD_BYTES:
                self._refuse(GatewayError(ErrorCode.TOO_LARGE, "the request trailers are too large", status=431))
            return
        headers = self._headers
        if len(headers) >= MAX_HEADERS:
            self._refuse(GatewayError(ErrorCode.TOO_LARGE, f"more than {MAX_HEADERS} header fields", status=431))
        if self._head_size > MAX_HEAD_BYTES:
            self._refuse(GatewayError(ErrorCode.TOO_LARGE, "the request head is too large", status=431))
        role = _REQUEST_FIELD_ROLES.get(name)
        if role is None:
            role = _REQUEST_FIELD_ROLES.learn(name)
        if role:
            self._note_field(role, value)
        headers.append((name, value))

    def _note_field(self, role: int, value: bytes) -> None:
        """A field the framing acts on (not a call for the others, most of them)."""
        if role == _AUTHORIZATION:
            if self._authorization is not None:
                self._refuse(GatewayError(ErrorCode.INVALID_INPUT, "two Proxy-Authorization fields"))
            self._authorization = value
        elif role == _CONNECTION:
            self._connection_values.append(value)
        elif role == _PROXY_CONNECTION:
            self._proxy_connection = True  # llhttp reads its keep-alive as a Connection field's
        else:  # Transfer-Encoding
            # Only `chunked` alone: any other coding makes the body length ambiguous between us
            # and the origin (request smuggling).
            if value.strip().lower() != b"chunked" or self._chunked:
                self._refuse(GatewayError(ErrorCode.INVALID_INPUT, "only one Transfer-Encoding: chunked is accepted"))
            self._chunked = True

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None  # callbacks run inside feed_data
        self._in_head = False
        self._raw_head_bytes = 0
        values = self._connection_values
        named = named_by_connection(values) if values else NOTHING_NAMED
        if named and named & FRAMING_FIELDS:
            # Framing fields are never hop-by-hop: stripping them after they framed the body would
            # have the origin read the body as a second request (smuggling).
            self._refuse(
                GatewayError(ErrorCode.INVALID_INPUT, "the Connection field names Content-Length or Transfer-Encoding")
            )
        self._head_size = 0  # from here on it counts trailer bytes
        method = parser.get_method()
        if method == b"CONNECT":
            self._connect = True
            return  # httptools raises HttpParserUpgrade next; `feed` turns it into a ConnectHead
        keep_alive = parser.should_keep_alive()
        # llhttp keeps an HTTP/1.0 (or 0.9, 2.0) request alive only when a Connection or
        # Proxy-Connection field asks it to: kept alive without either, the request is HTTP/1.1,
        # and the version string (httptools formats one per call, 2.6 k instructions) is not needed.
        http10 = (
            False if keep_alive and not values and not self._proxy_connection else parser.get_http_version() == "1.0"
        )
        self._events.append(
            self._new_head(
                method,
                self._url,
                self._headers,
                self._authorization,
                named,
                self._chunked,
                http10,
                keep_alive,
            )
        )
        # The next head starts empty (the lists went into the event).
        self._url = b""
        self._headers = []
        self._authorization = None
        self._chunked = False
        self._proxy_connection = False
        if values:
            self._connection_values = []

    def on_body(self, body: bytes) -> None:
        self._events.append(RequestBody(body))

    def on_message_complete(self) -> None:
        self._in_head = True
        self._head_size = 0  # the next head's (it counted this message's trailers)
        if self._connect:
            return  # no HTTP message follows: `feed` hands the rest to the tunnel
        parser = self._parser
        assert parser is not None  # callbacks run inside feed_data
        if not parser.should_keep_alive():
            self._no_more_requests = True
        self._events.append(_END)
