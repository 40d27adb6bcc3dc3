"""Swapping placeholders for real values on bound requests, and back again in their responses.

Pure functions over the proxy's header field block (each line `\\r\\nName: value`, as
`proxy/request_head.py` reads it and the upstream head carries it):
- `inject_credentials` finds, for each credential bound to the request, its placeholder at the
  injection point (`Authorization: Bearer <placeholder>`, Basic with the placeholder as
  password, or the named header), removes every client-sent line of that header, and appends
  one line with the real value. A bound credential whose placeholder is absent leaves the
  request alone (the agent's own login is not touched) unless `require: true`.
- `Scrubber` replaces real values with their placeholders in the first `window` bytes of a
  response as relayed (its head and body), streamed with an overlap so a value split across
  reads is still replaced. The replacement keeps the length, so chunk sizes and a
  `Content-Length` stay true without re-framing: a placeholder as long as the value (a
  shape-preserving one) comes back exactly; any other is cut or padded with `*` to the value's
  length. Either way the real value never reaches the agent.
Never logs, never raises with a value in the message, never touches a socket.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass

from gateway.credentials.screen import RequestFacts, bound_to
from gateway.credentials.store import HeldCredential, HeldSecrets
from gateway.errors import ErrorCode, GatewayError


@dataclass(frozen=True, slots=True)
class Injected:
    """What was injected: the credential's name and the header it went into (for the audit)."""

    credential: str
    header: str
    kind: str  # bearer | basic | header


def _lines(fields: bytes) -> list[bytes]:
    return [line for line in fields.split(b"\r\n") if line]


def _name_value(line: bytes) -> tuple[bytes, bytes]:
    name, _, value = line.partition(b":")
    return name.strip().lower(), value.strip()


def _carries_placeholder(credential: HeldCredential, value: bytes) -> bool:
    placeholder = credential.placeholder.encode()
    inject = credential.rule.inject
    if inject.kind == "header":
        return value == placeholder
    scheme, _, token = value.partition(b" ")
    if inject.kind == "bearer":
        return scheme.lower() == b"bearer" and token.strip() == placeholder
    if scheme.lower() != b"basic":
        return False
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    return decoded.partition(b":")[2] == placeholder


def _injected_value(credential: HeldCredential, value: bytes) -> bytes:
    inject = credential.rule.inject
    if inject.kind == "header":
        return value
    if inject.kind == "bearer":
        return b"Bearer " + value
    return b"Basic " + base64.b64encode(inject.username.encode() + b":" + value)


def inject_credentials(held: HeldSecrets, facts: RequestFacts, fields: bytes) -> tuple[bytes, list[Injected]]:
    """The field block with each bound credential's placeholder swapped for its value.

    Raises GatewayError: `policy_denied` when a `require: true` credential's placeholder is
    missing, `unavailable` when its source cannot be read now."""
    bound = bound_to(held, facts)
    if not bound:
        return fields, []
    lines = _lines(fields)
    injections: list[Injected] = []
    for credential in bound:
        header = credential.rule.inject.header.encode()
        values = [value for name, value in (_name_value(line) for line in lines) if name == header]
        if not any(_carries_placeholder(credential, value) for value in values):
            if credential.rule.require:
                raise GatewayError(
                    ErrorCode.POLICY_DENIED,
                    f"requests to {facts.host} must carry the placeholder of credential {credential.name!r}",
                    rule="credentials",
                )
            continue
        if credential.value is None:
            raise GatewayError(
                ErrorCode.UNAVAILABLE, f"credential {credential.name!r} cannot be read by the gateway just now"
            )
        # Every line of that header goes, the agent's own included: one credential reaches the host.
        lines = [line for line in lines if _name_value(line)[0] != header]
        display = credential.rule.inject.header.title().encode()
        lines.append(display + b": " + _injected_value(credential, credential.value))
        injections.append(Injected(credential.name, credential.rule.inject.header, credential.rule.inject.kind))
    return b"".join(b"\r\n" + line for line in lines), injections


def _same_length(placeholder: bytes, length: int) -> bytes:
    return placeholder[:length] if len(placeholder) >= length else placeholder + b"*" * (length - len(placeholder))


class Scrubber:
    """Replaces the real values of `credentials` in the first `window` bytes of one response;
    `on_finish` is called once, at `finish`, when anything was replaced (the audit line)."""

    __slots__ = ("_body_pairs", "_done", "_on_finish", "_overlap", "_tail", "replaced", "window")

    def __init__(
        self, credentials: list[HeldCredential], window: int, on_finish: Callable[[Scrubber], None] | None = None
    ) -> None:
        self._body_pairs = [
            (c.value, _same_length(c.placeholder.encode(), len(c.value))) for c in credentials if c.value
        ]
        self._overlap = max((len(value) for value, _ in self._body_pairs), default=1) - 1
        self._tail = b""
        self._done = 0  # bytes released
        self._on_finish = on_finish
        self.window = window
        self.replaced = 0

    def body(self, chunk: bytes) -> bytes:
        """The bytes that may be sent now; up to `overlap` bytes are held back for `finish`."""
        if not self._body_pairs:
            return chunk
        data = self._tail + chunk
        if self._done >= self.window:
            self._tail = b""
            return data
        for value, placeholder in self._body_pairs:
            count = data.count(value)
            if count:
                self.replaced += count
                data = data.replace(value, placeholder)
        # Hold back what could be the start of a value the next read completes.
        keep = min(self._overlap, len(data))
        if self._done + len(data) - keep >= self.window:
            keep = 0
        release, self._tail = data[: len(data) - keep], data[len(data) - keep :]
        self._done += len(release)
        return release

    def finish(self) -> bytes:
        """What is still held back, at the response's end."""
        tail, self._tail = self._tail, b""
        if self.replaced and self._on_finish is not None:
            report, self._on_finish = self._on_finish, None
            report(self)
        return tail
