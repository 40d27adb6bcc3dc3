"""The JSON audit log: one line per decision and one when a tunnel or request closes.

Fields are chosen for security review: who, what kind, which host and port, which addresses,
the decision and its code, the policy generation, durations and byte counts. Never a URL path or
query, never a search query, never a credential or key. Lines are built by hand (fixed keys,
orjson only for the values) because the proxy writes one per request on its hot path.
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


class AuditLog:
    """Writes audit lines to stdout, a file, or nowhere (`off`)."""

    def __init__(self, destination: str) -> None:
        self._stream: IO[bytes] | None
        self._owned = False
        self._pending: list[bytes] = []
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
        record.update({k: v for k, v in fields.items() if v is not None})
        self._pending.append(orjson.dumps(record, default=str) + b"\n")
        if len(self._pending) > 1:
            return
        # Lines written in one event-loop iteration leave in one write() at the end of it: one
        # syscall per iteration instead of one per line, and never later than the next tick.
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:
            self.flush()

    def flush(self) -> None:
        if self._stream is None or not self._pending:
            return
        data = b"".join(self._pending)
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

    def close(self) -> None:
        self.flush()
        if self._owned and self._stream is not None:
            self._stream.close()
            self._stream = None
