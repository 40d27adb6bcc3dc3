"""The JSON audit log: one line per decision and one when a tunnel or request closes.

Fields are chosen for security review: who, what kind, which host and port, which addresses,
the decision and its code, the policy generation, durations and byte counts. Never a URL path or
query, never a search query, never a credential or key.

Lines are buffered and leave in one write() at most `FLUSH_INTERVAL_S` after the first of them
(or as soon as `MAX_PENDING_LINES` are waiting): at thousands of tunnels per second a write() per
line or per loop iteration was the largest single cost of a tunnel after the kernel's own.
`flush()` writes at once (the tools API calls it before answering) and `close()` flushes at
shutdown, so only a killed process can lose the last few milliseconds of lines.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

import orjson

log = logging.getLogger("egress_gateway.audit")

FLUSH_INTERVAL_S = 0.01
MAX_PENDING_LINES = 1024


class AuditLog:
    """Writes audit lines to stdout, a file, or nowhere (`off`)."""

    def __init__(self, destination: str) -> None:
        self._stream: IO[bytes] | None
        self._owned = False
        self._pending: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None
        if destination == "off":
            self._stream = None
        elif destination == "-":
            self._stream = sys.stdout.buffer
        else:
            self._stream = open(destination, "ab", buffering=0)  # noqa: SIM115 - closed in close()
            self._owned = True

    def write(self, event: str, **fields: Any) -> None:
        if self._stream is None:
            return
        record: dict[str, Any] = {"ts": time.time(), "event": event}
        for key, value in fields.items():
            if value is not None:
                record[key] = value
        self.write_record(record)

    def write_record(self, record: dict[str, Any]) -> None:
        """A line already built by the caller: `ts` and `event` first, no None values (the proxy
        builds its lines as dict literals on its hot path)."""
        if self._stream is None:
            return
        pending = self._pending
        pending.append(orjson.dumps(record, default=str))
        if len(pending) == 1:
            try:
                self._timer = asyncio.get_running_loop().call_later(FLUSH_INTERVAL_S, self.flush)
            except RuntimeError:
                self.flush()
        elif len(pending) >= MAX_PENDING_LINES:
            self.flush()

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stream is None or not self._pending:
            return
        data = b"\n".join(self._pending) + b"\n"
        self._pending.clear()
        try:
            self._stream.write(data)
            if not self._owned:
                self._stream.flush()
        except (OSError, ValueError) as exc:
            log.error("audit write failed: %s", exc)

    def decision(
        self,
        *,
        kind: str,
        principal: str | None,
        host: str | None,
        port: int | None,
        addresses: Sequence[str] = (),
        decision: str,
        code: str | None,
        reason: str | None = None,
        generation: int | None = None,
        **extra: Any,
    ) -> None:
        self.write(
            "decision",
            kind=kind,
            principal=principal,
            host=host,
            port=port,
            addresses=list(addresses) or None,
            decision=decision,
            code=code,
            reason=reason,
            generation=generation,
            **extra,
        )

    def connection_closed(
        self,
        *,
        kind: str,
        principal: str,
        host: str,
        port: int,
        bytes_up: int,
        bytes_down: int,
        duration_s: float,
        reason: str,
    ) -> None:
        """The close line of a tunnel or a forwarded request: the proxy writes one per connection."""
        self.write_record(
            {
                "ts": time.time(),
                "event": "close",
                "kind": kind,
                "principal": principal,
                "host": host,
                "port": port,
                "bytes_up": bytes_up,
                "bytes_down": bytes_down,
                # Microseconds; round(x, 6) would format and parse a decimal string for the same value.
                "duration_s": round(duration_s * 1e6) / 1e6,
                "close_reason": reason,
            }
        )

    def close(self) -> None:
        self.flush()
        if self._owned and self._stream is not None:
            self._stream.close()
            self._stream = None
