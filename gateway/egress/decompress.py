"""Bounded content decoding: gzip, deflate and br, never inflated past the decoded cap.

A decompression bomb (a few KiB that inflate to gigabytes) stops at the cap: every step asks the
decoder for at most the room left, so memory never holds more than the cap plus one chunk.
Never touches the network.
"""

from __future__ import annotations

import zlib
from typing import Protocol

import brotli

from gateway.errors import ErrorCode, GatewayError


def _decoded_too_large(cap: int) -> GatewayError:
    return GatewayError(ErrorCode.TOO_LARGE, f"decoded body exceeds the {cap}-byte decoded cap")


class _Decoder(Protocol):
    def feed(self, data: bytes, room: int) -> bytes: ...

    def holds_output(self) -> bool:
        """True when output is waiting that the room left could not take."""
        ...


class _Identity:
    def feed(self, data: bytes, room: int) -> bytes:
        return data

    def holds_output(self) -> bool:
        return False


class _Zlib:
    def __init__(self, wbits: int) -> None:
        self._wbits = wbits
        self._inflater = zlib.decompressobj(wbits)
        self._started = False

    def feed(self, data: bytes, room: int) -> bytes:
        try:
            return self._feed(data, room)
        except zlib.error:
            if self._started or self._wbits != zlib.MAX_WBITS:
                raise
            # Servers send raw deflate under "deflate" as often as zlib-wrapped streams.
            self._wbits = -zlib.MAX_WBITS
            self._inflater = zlib.decompressobj(self._wbits)
            return self._feed(data, room)

    def _feed(self, data: bytes, room: int) -> bytes:
        out = self._inflater.decompress(data, room + 1)
        self._started = True
        return out

    def holds_output(self) -> bool:
        return bool(self._inflater.unconsumed_tail)


class _Brotli:
    def __init__(self) -> None:
        self._inflater = brotli.Decompressor()

    def feed(self, data: bytes, room: int) -> bytes:
        out = self._inflater.process(data, output_buffer_limit=room + 1)
        return bytes(out)

    def holds_output(self) -> bool:
        return not self._inflater.can_accept_more_data()


def _decoder_for(encoding: str) -> _Decoder:
    if encoding in ("gzip", "x-gzip"):
        return _Zlib(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return _Zlib(zlib.MAX_WBITS)
    if encoding == "br":
        return _Brotli()
    if encoding in ("identity", ""):
        return _Identity()
    raise GatewayError(ErrorCode.UNSUPPORTED_CONTENT, f"unsupported Content-Encoding {encoding!r}")


class BoundedBody:
    """Accumulates a response body, enforcing the wire cap and the decoded cap separately."""

    def __init__(self, content_encoding: str | None, *, max_wire_bytes: int, max_decoded_bytes: int) -> None:
        encodings = [e.strip().lower() for e in (content_encoding or "").split(",") if e.strip()]
        if len(encodings) > 2:
            raise GatewayError(ErrorCode.UNSUPPORTED_CONTENT, "more than two stacked Content-Encodings")
        # Encodings are listed in the order applied, so they are undone in reverse.
        self._decoders = [_decoder_for(e) for e in reversed(encodings)]
        self._max_wire = max_wire_bytes
        self._max_decoded = max_decoded_bytes
        self.wire_bytes = 0
        self._parts: list[bytes] = []
        self.decoded_bytes = 0

    def feed(self, chunk: bytes) -> None:
        self.wire_bytes += len(chunk)
        if self.wire_bytes > self._max_wire:
            raise GatewayError(ErrorCode.TOO_LARGE, f"body exceeds the {self._max_wire}-byte wire cap")
        data = chunk
        room = self._max_decoded - self.decoded_bytes
        try:
            for decoder in self._decoders:
                data = decoder.feed(data, room)
                if len(data) > room:
                    raise _decoded_too_large(self._max_decoded)
        except (zlib.error, brotli.error) as exc:
            raise GatewayError(
                ErrorCode.UNSUPPORTED_CONTENT, f"corrupt compressed body ({exc.__class__.__name__})"
            ) from None
        self._drain_pending(data, room)

    def _drain_pending(self, data: bytes, room: int) -> None:
        self.decoded_bytes += len(data)
        self._parts.append(data)
        # A decoder holding back output it could not hand over means the cap is reached.
        if any(decoder.holds_output() for decoder in self._decoders):
            raise _decoded_too_large(self._max_decoded)

    def result(self) -> bytes:
        return b"".join(self._parts)


RATIO_FLOOR_BYTES = 64 * 1024


class StreamingDecode:
    """Decodes a body chunk by chunk up to `max_decoded_bytes`, then stops: for a scanner that
    reads only a window of a request body (`gateway/scan/`), the rest is never inflated. Also
    stops when the output outgrows `max_ratio` times the input, so a bomb costs
    no more CPU than the window it fills (the first `RATIO_FLOOR_BYTES` are always allowed: a
    short, very repetitive body is legitimately past any ratio). Raises unsupported_content on an unknown or corrupt
    encoding."""

    def __init__(self, content_encoding: str | None, *, max_decoded_bytes: int, max_ratio: int = 1000) -> None:
        encodings = [e.strip().lower() for e in (content_encoding or "").split(",") if e.strip()]
        if len(encodings) > 2:
            raise GatewayError(ErrorCode.UNSUPPORTED_CONTENT, "more than two stacked Content-Encodings")
        self._decoders = [_decoder_for(e) for e in reversed(encodings)]
        self._max_decoded = max_decoded_bytes
        self._max_ratio = max_ratio
        self.wire_bytes = 0
        self.decoded_bytes = 0
        self.capped = False  # the window (or the ratio) was reached: nothing more is decoded

    def feed(self, chunk: bytes) -> bytes:
        if self.capped:
            return b""
        self.wire_bytes += len(chunk)
        allowed = self._max_ratio * self.wire_bytes + RATIO_FLOOR_BYTES
        room = min(self._max_decoded, allowed) - self.decoded_bytes
        data = chunk
        try:
            for decoder in self._decoders:
                data = decoder.feed(data, max(room, 0))
        except (zlib.error, brotli.error) as exc:
            raise GatewayError(
                ErrorCode.UNSUPPORTED_CONTENT, f"corrupt compressed body ({exc.__class__.__name__})"
            ) from None
        if len(data) > room or any(decoder.holds_output() for decoder in self._decoders):
            data = data[: max(room, 0)]
            self.capped = True
        self.decoded_bytes += len(data)
        return data
