"""The plaintext side of a terminated TLS connection, as an `asyncio.Transport`.

The proxy's HTTP/1.1 client connection writes to this transport as it writes to any other; each
write is encrypted by the connection's `TlsTerminator` and sent on the real socket's transport.
Flow control, peer address and closing are the real transport's. TLS has no half-close: a
`write_eof` sends close_notify and the connection closes once the exchange ends.

Owns no socket and no policy; never decrypts (the bridge that feeds the terminator does).
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.inspect.terminator import TlsTerminator


class TlsClientTransport(asyncio.Transport):
    """Writes are encrypted for the agent; everything else is the underlying transport's."""

    __slots__ = ("_closed", "_protocol", "raw", "terminator")

    def __init__(self, raw: asyncio.Transport, terminator: TlsTerminator) -> None:
        super().__init__()
        self.raw = raw
        self.terminator = terminator
        self._protocol: asyncio.BaseProtocol | None = None
        self._closed = False

    # writing ------------------------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed or self.raw.is_closing():
            return
        records = self.terminator.write(bytes(data))
        if records:
            self.raw.write(records)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        self.close()

    def get_write_buffer_size(self) -> int:
        return self.raw.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.raw.set_write_buffer_limits(high, low)

    # reading ------------------------------------------------------------------------------------
    def pause_reading(self) -> None:
        self.raw.pause_reading()

    def resume_reading(self) -> None:
        self.raw.resume_reading()

    def is_reading(self) -> bool:
        return self.raw.is_reading()

    # the rest -----------------------------------------------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.raw.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def is_closing(self) -> bool:
        return self._closed or self.raw.is_closing()

    def close(self) -> None:
        """close_notify, then the socket (after what is buffered has been sent)."""
        if self._closed:
            return
        self._closed = True
        if not self.raw.is_closing():
            self.raw.write(self.terminator.close())
            self.raw.close()

    def abort(self) -> None:
        self._closed = True
        self.raw.abort()
