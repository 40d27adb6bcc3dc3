"""One client connection as its decisions and audit lines see it: made once, passed, never rebuilt.

Owns what is fixed when a client connection is accepted (as mitmproxy's `proxy/context.py` keeps
a connection's client and options for every layer of it): the transport, the audit members every
line of the connection ends with (`conn`, `client_ip`, `client_port`, a redirected connection's
`original_dst` where its lines carry it), where a redirected connection was sent, and the principal
when the listener decides it (a transparent port's uid) together with the policy it was found
under. The forward proxy's principal comes with each request (its Proxy-Authorization), so there
both are None and each decision reads the policy in force when it is made. The uid behind a
loopback client is read from the kernel at most once per connection, only when the policy binds
uids.

Never decides anything, never writes an audit line or to the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gateway.peer_uid import loopback_peer_uid
from gateway.policy.model import LoadedPolicy, Principal
from gateway.vet.addresses import IPAddress

# Not looked up yet (None is a looked-up answer: not on loopback, or the socket is gone).
_UNKNOWN_UID = object()


class ClientContext:
    """A client connection's fixed facts, shared by everything that serves it."""

    __slots__ = ("_peer_uid", "audit_fields", "loaded", "original", "original_dst", "principal", "transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        audit_fields: Mapping[str, Any],
        # Positional from the forward proxy (one made per connection: keywords cost a dict).
        original: tuple[IPAddress, int] | None = None,
        *,
        original_dst: str | None = None,
        principal: Principal | None = None,
        loaded: LoadedPolicy | None = None,
    ) -> None:
        self.transport = transport
        # On every line of the connection: `conn`, `client_ip`, `client_port`.
        self.audit_fields = audit_fields
        # A redirected connection's original destination, and its text for the decision lines
        # that name it (`original_dst`); None on the forward proxy.
        self.original = original
        self.original_dst = original_dst
        # The listener's answer to "who is asking", with the policy it was read from; None when
        # each request names its own principal.
        self.principal = principal
        self.loaded = loaded
        self._peer_uid: int | object | None = _UNKNOWN_UID

    def peer_uid(self, loaded: LoadedPolicy) -> int | None:
        """The uid behind a loopback client, when the policy binds uids to principals (an agent
        cannot borrow another principal, or `default`, through this listener); read from the
        kernel once per connection, and never when no uid is bound."""
        if not loaded.policy.transparent.principals:
            return None
        uid = self._peer_uid
        if uid is _UNKNOWN_UID:
            transport = self.transport
            uid = self._peer_uid = loopback_peer_uid(
                transport.get_extra_info("peername"), transport.get_extra_info("sockname")
            )
        return uid if isinstance(uid, int) else None
