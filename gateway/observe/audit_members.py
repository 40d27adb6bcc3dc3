"""Members of audit lines serialized once: the part of a line that repeats from line to line.

Owns the bytes form of what `audit.AuditLog` writes on the proxy's hot path: a dict's members
without its braces (`json_members`), a client connection's fields with their members serialized
when the connection is accepted (`ConnectionFields`), and the members of a tunnel's close line that
depend only on its decision (`close_members`), in the order `AuditLog.connection_closed` writes
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
    and, in `members`, the same fields serialized with a leading comma: every line of the
    connection (a tunnel's two, a keep-alive connection's two per request) joins these bytes
    instead of serializing the dict again. Never changed after it is built (the members would
    no longer be its fields)."""

    # Set by `audit_fields.connection_fields`, which builds it with dict's own constructor (an
    # `__init__` of ours would be one Python call more per connection).
    __slots__ = ("members",)
    members: bytes


def json_members(fields: Mapping[str, Any]) -> bytes:
    """`fields` as the members of a JSON object without its braces (`"k":v,…`; a None is written
    as null, so a caller that leaves None out drops it first), for `AuditLog.write_members`:
    members that repeat from line to line (a decision's, a client's) are serialized once instead
    of built into a dict for every line."""
    return orjson.dumps(fields, default=str)[1:-1]


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
