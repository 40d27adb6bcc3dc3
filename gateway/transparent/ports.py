"""Principals by port: which listener port each agent uid is redirected to.

The kernel does not tell the accepting side who owns a redirected socket, so the rules send each
listed uid to a port of its own and every other uid to the base port. Both the redirect rules and
the listeners derive the ports from the same function, so they cannot disagree. Pure: no sockets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.errors import ErrorCode, GatewayError


@dataclass(frozen=True, slots=True)
class PortAssignment:
    port: int
    uid: int | None  # None: every uid the policy does not list


def assign_ports(base_port: int, uids: Sequence[int]) -> tuple[PortAssignment, ...]:
    """The base port for unlisted uids, then base+1, base+2... for the listed uids in ascending order."""
    ordered = sorted(set(uids))
    if base_port == 0 and ordered:
        raise GatewayError(ErrorCode.INVALID_INPUT, "per-uid listener ports need a fixed base port, not 0")
    if base_port + len(ordered) > 65535:
        raise GatewayError(ErrorCode.INVALID_INPUT, f"{len(ordered)} uids do not fit above port {base_port}")
    return (PortAssignment(base_port, None), *(PortAssignment(base_port + 1 + i, uid) for i, uid in enumerate(ordered)))
