"""Members of audit lines serialized once: the part of a line that repeats from line to line.

Owns the bytes form of what `audit.AuditLog` writes on the proxy's hot path: a dict's members
without its braces (`json_members`), a client connection's fields with their members serialized
as a line's end when the connection is accepted (`ConnectionFields`), the members of a close line that depend
only on its decision (`close_members`), and a close line but its client's members as one format
of its counts and duration (`close_format`), in the order `AuditLog.connection_closed` writes
them, so a line joined from them is byte for byte the line built from a dict. Never writes a line
itself, never decides which fields a line has beyond that order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import orjson


class DecidedTarget(Protocol):
    """What a close line repeats of its decision (the egress core's `PinnedTarget`)."""

    @property
    def generation(self) -> int: ...

    @property
    def rule(self) -> str | None: ...

    @property
    def rule_pattern(self) -> str | None: ...


class TunnelTarget(DecidedTarget, Protocol):
    """What a tunnel's close line names of its decision: the decision's fields and where it went."""

    @property
    def name(self) -> str: ...

    @property
    def port(self) -> int: ...


class ConnectionFields(dict[str, Any]):
    """A client connection's audit fields (`conn`, `client_ip`, `client_port`, none of them None)
    and, in `line_end`, the same fields serialized with a leading comma, then the line's closing
    brace and newline: every line of the connection (a tunnel's two, a keep-alive connection's
    two per request) ends with these bytes instead of serializing the dict again. Never changed
    after it is built (the bytes would no longer be its fields)."""

    # Set by `audit_fields.connection_fields`, which builds it with dict's own constructor (an
    # `__init__` of ours would be one Python call more per connection).
    __slots__ = ("line_end",)
    line_end: bytes


def json_members(fields: Mapping[str, Any]) -> bytes:
    """`fields` as the members of a JSON object without its braces (`"k":v,…`; a None is written
    as null, so a caller that leaves None out drops it first), for `AuditLog.write_line`:
    members that repeat from line to line (a decision's, a client's) are serialized once instead
    of built into a dict for every line."""
    return orjson.dumps(fields, default=str)[1:-1]


def close_format(kind: str, principal: str, target: TunnelTarget, closing: bytes, after_rule: bytes) -> bytes:
    """A close line's members but the client's, as one bytes format of its counts and duration
    (`format % (bytes_up, bytes_down, duration)`, the duration as its JSON text): `event` to
    `port`, the counts, `closing` (`close_reason` and `outcome` with a leading comma), the
    decision's `generation`, `rule`, `rule_pattern`, then `after_rule` (a forwarded request's
    members, the `address`), as `connection_closed` orders them."""
    head, decided = close_members(kind, principal, target)
    # A member's text may hold a `%` (a percent-encoded path): doubled, it formats as itself.
    tail = closing + decided + after_rule
    return head.replace(b"%", b"%%") + b',"bytes_up":%d,"bytes_down":%d,"duration_s":%s' + tail.replace(b"%", b"%%")


def close_members(kind: str, principal: str, target: TunnelTarget) -> tuple[bytes, bytes]:
    """A close line's members before its counts (`event` to `port`) and after its outcome
    (`generation`, `rule`, `rule_pattern`, with a leading comma), as `connection_closed` orders them."""
    head = json_members(
        {"event": "close", "kind": kind, "principal": principal, "host": target.name, "port": target.port}
    )
    decided: dict[str, Any] = {"generation": target.generation}
    if target.rule is not None:
        decided["rule"] = target.rule
        if target.rule_pattern is not None:
            decided["rule_pattern"] = target.rule_pattern
    return head, b"," + json_members(decided)
