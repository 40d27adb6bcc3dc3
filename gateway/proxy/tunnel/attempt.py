"""One tunnel attempt, from the client's ask to a splice or an inspected hand-over, in one place.

Owns a CONNECT's and a transparent connection's way to a tunnel, read top to bottom below:
`start` finds who asks for what (`TunnelSurface.identify`), reserves the tunnel (first, where the
surface says so, so that a burst cannot overshoot the limits), decides from cached state without
a task and chooses the hand-over (`_inspected`: the one place that chooses inspection over a
splice); on a DNS-cache miss `_resolve` is the one owned task; `_decided` applies the listener's
destination rule and hands over to inspection (`_hand_to_inspection`) or splices: reserves (if not
yet) and dials with a `PinnedDial` (no task, each attempt bounded by the client connection's
wheel entry, this object being its `DialDeadline`); `dial_connected` gives the
client to a `Tunnel`. `state` names where it is (`AttemptState`). The reservation is given back
by `_settle` on every path but the splice, whose `Tunnel` holds it until
`TunnelOpener.tunnel_closed`.

The forward proxy and the transparent listener differ through one small interface, the
`TunnelSurface` (as Smokescreen's `Decider` keeps its callers apart), and the client connection
the attempt serves is a `TunnelClient`; neither subclasses the other.

Never parses the client's bytes (its connection does), never splices them (`splice.Tunnel`
does), never dials anything but a `PinnedTarget` through a `PinnedDial`.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from gateway.egress.connect import PinnedDial
from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.observe.loop_metrics import HistogramChild
from gateway.policy.inspect_decide import inspects_host
from gateway.policy.model import LoadedPolicy, Principal
from gateway.proxy.deadlines.wheel import LazyDeadline
from gateway.proxy.decision.context import ClientContext
from gateway.proxy.tunnel.opener import TunnelOpener
from gateway.proxy.tunnel.splice import Tunnel, TunnelKind, UpstreamTunnelProtocol
from gateway.tasks import spawn
from gateway.vet.urls import VettedHost

Ask = TypeVar("Ask")


class AttemptState(enum.Enum):
    DECIDING = "deciding"  # who asks for what, the limits, the decision from cached state
    RESOLVING = "resolving"  # the decision waits for DNS (the one owned task)
    DIALING = "dialing"  # the pinned dial runs
    OPEN = "open"  # spliced: the `Tunnel` owns the client and the reservation
    INSPECTED = "inspected"  # handed to inspection (TLS terminated, each request judged)
    REFUSED = "refused"  # a decision refused it: its deny line written, the client told
    FAILED = "failed"  # every address failed, or the dial was stopped: allow and close lines
    ABANDONED = "abandoned"  # the client (or the listener) went away while the upstream was dialed


# The states as module names, read on every tunnel: under Python 3.11 each `AttemptState.X` read
# goes through `EnumType.__getattr__`'s slot hook, about 0.8 k instructions more than a global's
# (bench/HISTORY.md, "Tunnel cost"). Stored and compared as the enum's members all the same.
DECIDING = AttemptState.DECIDING
RESOLVING = AttemptState.RESOLVING
DIALING = AttemptState.DIALING
OPEN = AttemptState.OPEN
INSPECTED = AttemptState.INSPECTED
REFUSED = AttemptState.REFUSED
FAILED = AttemptState.FAILED
ABANDONED = AttemptState.ABANDONED


class Inspection(Protocol):
    """TLS interception for the hosts an `inspect` entry names (`inspected.InspectService`)."""

    def take_over(
        self,
        raw: asyncio.Transport,
        *,
        principal: str,
        host: str,
        port: int,
        early: bytes,
        audit_fields: Mapping[str, Any],
        preface: bytes = b"",
    ) -> None: ...

    def begin_drain(self) -> None: ...

    def has_busy_connections(self) -> bool: ...

    def close(self) -> None: ...


class TunnelSurface(TunnelKind, Protocol[Ask]):
    """How one listener's tunnels differ: the audit `kind` (and its connect-latency child) and
    the SNI gate's mode (`sni`, None: the policy's), as its tunnels read them (`TunnelKind`);
    whether the reservation comes before the decision (`reserve_first`), how the principal and
    the name are found (`identify`) and what destination means (`destination`), and what the
    client is told on success (`established`) and on a refusal (`refusal`). Each listener has
    one, and with it its loop and inspection."""

    reserve_first: bool
    latency: HistogramChild
    opener: TunnelOpener
    # The listener's loop, set as it starts (before any connection): an attribute, not a
    # property, as it is read on every dial.
    loop: asyncio.AbstractEventLoop | None

    @property
    def inspection(self) -> Inspection | None: ...

    def identify(self, attempt: TunnelAttempt[Ask]) -> None:
        """Set the attempt's `principal`, `host`, `host_name` and `port` from its `ask`, each as
        soon as it is known (a refusal's line names what was found); raise a `GatewayError` to
        refuse."""
        ...

    def claimed_principal(self, attempt: TunnelAttempt[Ask]) -> str | None:
        """Who the refused client claimed to be when no principal was found (its line names it)."""
        ...

    @property
    def destination(self) -> Callable[[TunnelAttempt[Ask], PinnedTarget], PinnedTarget] | None:
        """What destination means: the target to dial for the egress core's decision (raise a
        `GatewayError` to refuse), or None where the decision is dialed as it is (no call per
        tunnel for nothing)."""
        ...

    def established(self, conn: object) -> bytes:
        """What the client reads once its tunnel (or inspection) is ready (may be nothing)."""
        ...

    def refusal(self, error: GatewayError, conn: object) -> bytes:
        """What the client reads before the close when its attempt is refused (may be nothing)."""
        ...


class TunnelClient(Protocol):
    """The client connection an attempt serves (`client_connection.ClientConnection`,
    `transparent/listener.TransparentConnection`): it holds the client's early bytes while the
    attempt runs and gives its transport away when told."""

    @property
    def closed(self) -> bool: ...

    def gone_reason(self) -> str | None:
        """Why a dialed upstream can no longer become a tunnel (the client left, the listener
        drains), for the close line; None while it can."""
        ...

    def splice(self, tunnel: Tunnel) -> None:
        """The tunnel owns the client's side from now on: the early bytes go to it."""
        ...

    def detach(self) -> bytes:
        """The connection lets go of its transport (inspection takes it); returns the early bytes."""
        ...

    def attempt_ended(self, answer: bytes) -> None:
        """Refused, failed or abandoned: write `answer` (if any) and close."""
        ...


class TunnelAttempt(Generic[Ask]):
    """One client's way to a tunnel: decision, resolution, hand-over choice, dial, hand-over."""

    __slots__ = (
        "_dial",
        "_reserved",
        "ask",
        "client",
        "context",
        "deadline",
        "host",
        "host_name",
        "loaded",
        "opener",
        "port",
        "principal",
        "state",
        "surface",
    )

    def __init__(
        self,
        surface: TunnelSurface[Ask],
        context: ClientContext,
        client: TunnelClient,
        deadline: LazyDeadline,
        ask: Ask,
    ) -> None:
        self.surface = surface
        self.opener = surface.opener
        self.context = context
        self.client = client
        # The client connection's one wheel entry: it bounds each attempt of the dial, then the
        # tunnel's idle time and lifetime.
        self.deadline = deadline
        self.ask = ask
        self.state = DECIDING
        # The policy the listener found the principal under (a transparent port's), else the one
        # in force now: the whole attempt is decided under it.
        self.loaded: LoadedPolicy = context.loaded or surface.opener.core.policy.current
        self.principal: Principal | None = context.principal
        self.host: VettedHost | None = None
        self.host_name: str | None = None  # for the lines: the name as far as it was read
        self.port: int | None = None
        self._reserved = False
        self._dial: PinnedDial[UpstreamTunnelProtocol] | None = None

    # deciding ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Decided here when cached state suffices: a refusal costs no task."""
        surface = self.surface
        try:
            surface.identify(self)
            principal, host, port = self.principal, self.host, self.port
            assert principal is not None
            assert host is not None
            assert port is not None
            if surface.reserve_first:
                self.opener.reserve(principal.name, self.loaded.policy.proxy)
                self._reserved = True
            target = self.opener.core.pin_cached(principal, host, port, self.loaded)
            # Chosen once the name is allowed, before any lookup: an inspected host without an
            # interception CA is refused as such, whatever its DNS says. Most policies inspect
            # nothing: three fields tested before the choice is looked up.
            policy = self.loaded.policy
            inspects_any = principal.inspect or policy.defaults.inspect or policy.credentials.entries
            inspected = self._inspected(principal, host.name, port) if inspects_any else False
        except GatewayError as error:
            self._refuse(error)
            return
        if target is None:
            # The decision waits for DNS, in the attempt's one task. Nothing is due until the
            # dial's first attempt starts (the lookup has its own timeout).
            self.state = RESOLVING
            self.deadline.clear()
            spawn(self._resolve(principal, host, port, inspected), name=f"{surface.kind}-resolve", loop=surface.loop)
            return
        self._decided(target, inspected)

    def start_decided(self, target: PinnedTarget) -> None:
        """An attempt decided before it began (a raw TCP exception, on its address alone): not
        TLS, so never inspected; straight to the splice (its address is the original one, which
        the destination rule keeps)."""
        self.host = target.host
        self.host_name = target.name
        self.port = target.port
        self._decided(target, False)

    async def _resolve(self, principal: Principal, host: VettedHost, port: int, inspected: bool) -> None:
        try:
            target = await self.opener.core.pin(principal, host, port, loaded=self.loaded)
        except GatewayError as error:
            self._refuse(error)
            return
        except BaseException:
            self._settle()  # cancelled (shutdown): the reservation must not leak
            raise
        self._decided(target, inspected)
        dial = self._dial
        if dial is not None and self.opener.shutting_down:
            dial.cancel()  # the listener shut down while DNS answered: it stops no dial made later

    def _decided(self, target: PinnedTarget, inspected: bool) -> None:
        """The listener's destination rule, then the hand-over chosen: inspection, or a splice:
        reserve (if the surface did not before deciding), then dial without a task."""
        destination = self.surface.destination
        if destination is not None:
            try:
                target = destination(self, target)
            except GatewayError as error:
                self._refuse(error)
                return
        if inspected:
            self._hand_to_inspection(target)
            return
        opener = self.opener
        if not self._reserved:
            principal = self.principal
            assert principal is not None
            try:
                opener.reserve(principal.name, self.loaded.policy.proxy)
            except GatewayError as error:
                self._refuse(error)
                return
            self._reserved = True
        loop = self.surface.loop
        assert loop is not None  # set as the listener starts, before any connection
        self.state = DIALING
        dial = self._dial = PinnedDial(loop, target, opener.upstream_protocol, self, self)
        # Referenced until its outcome is told, so that the listener's shutdown reaches it.
        opener.dialing.add(dial)
        dial.start()

    def _inspected(self, principal: Principal, name: str, port: int) -> bool:
        """The one choice of the hand-over: whether a host an `inspect` entry names (or a bound
        credential) is terminated rather than spliced; refused when no interception CA is
        configured (a bypass comes only from policy)."""
        if not inspects_host(self.loaded.policy, principal, name, port, tls=True):
            return False
        if self.surface.inspection is None:
            raise GatewayError(
                ErrorCode.INSPECTION_UNSUPPORTED,
                f"{name} is inspected but no interception CA is configured (EGRESS_INSPECT_CA_CERT)",
            )
        return True

    # the reservation --------------------------------------------------------------------------
    def _settle(self) -> None:
        """Give the reservation back, once: every path but the splice, whose tunnel holds it."""
        if self._reserved:
            self._reserved = False
            principal = self.principal
            assert principal is not None
            self.opener.release(principal.name)

    # handing over -----------------------------------------------------------------------------
    def _hand_to_inspection(self, target: PinnedTarget) -> None:
        # Inspected requests are limited per request (the pool, the deadlines), not as a tunnel.
        self._settle()
        self.state = INSPECTED
        client, service, principal = self.client, self.surface.inspection, self.principal
        assert service is not None
        assert principal is not None
        if client.closed:
            client.attempt_ended(b"")
            return
        context = self.context
        self.opener.records.record_allow(
            self.surface.kind, principal, target, client=context.audit_fields, original_dst=context.original_dst
        )
        early = client.detach()
        service.take_over(
            context.transport,
            principal=principal.name,
            host=target.name,
            port=target.port,
            early=early,
            audit_fields=context.audit_fields,
            preface=self.surface.established(context.audit_fields.get("conn")),
        )

    # DialDeadline (gateway.egress.dial_deadline): the connection's wheel entry, which has nothing
    # else due while the upstream is dialed, bounds each attempt: no loop timer per dial.
    def start_dial_attempt(self) -> None:
        self.deadline.set_at(time.monotonic() + self.loaded.policy.proxy.connect_timeout_s)

    def end_dial_attempt(self) -> None:
        self.deadline.clear()

    def deadline_passed(self) -> None:
        """The client connection's entry expired while the attempt runs: while dialing, the
        attempt running outlived connect_timeout_s (even if the client has left: the dial must
        still end, with its audit lines), and the dialer takes it as its timeout."""
        if self._dial is not None:
            self._dial.attempt_timed_out()

    # DialOwner (gateway.egress.connect): how the dial ended.
    def dial_connected(self, transport: asyncio.Transport, protocol: UpstreamTunnelProtocol, address: str) -> None:
        dial = self._dial
        assert dial is not None
        self._dial = None
        opener, surface, context, principal = self.opener, self.surface, self.context, self.principal
        assert principal is not None
        opener.dialing.discard(dial)
        surface.latency.observe(time.perf_counter() - dial.started)
        target = dial.target
        opener.records.record_allow(
            surface.kind, principal, target, client=context.audit_fields, original_dst=context.original_dst
        )
        gone = self.client.gone_reason()
        if gone is not None:
            # The allowed decision and a close line still reach the audit trail.
            self.state = ABANDONED
            transport.close()
            self._settle()
            self._never_opened(principal, target, gone)
            self.client.attempt_ended(b"")
            return
        self.state = OPEN
        client_transport = context.transport
        established = surface.established(context.audit_fields.get("conn"))
        if established:
            client_transport.write(established)
        tunnel = Tunnel(self, transport, protocol, address, target)
        # The reservation is the tunnel's now: `TunnelOpener.tunnel_closed` gives it back.
        opener.tunnels.add(tunnel)
        self._reserved = False
        self.client.splice(tunnel)

    def dial_failed(self, error: GatewayError | None) -> None:
        """Every address failed (`error`), or the dial was cancelled (None): the allow line and a
        close line with the error, or with `shutdown` when the listener's shutdown stopped it."""
        dial = self._dial
        assert dial is not None
        self._dial = None
        self.opener.dialing.discard(dial)
        self._settle()
        self.state = FAILED
        target = dial.target
        if error is not None:
            if error.destination is None:
                error.destination = (target.name, target.port)  # a refusal's status line names it
            reason: str | None = str(error.code)
        else:
            # None and not shutting down: stopped by a defect, which the loop's handler reports.
            reason = "shutdown" if self.opener.shutting_down else None
        if reason is not None:
            principal = self.principal
            assert principal is not None
            context = self.context
            self.opener.records.record_allow(
                self.surface.kind, principal, target, client=context.audit_fields, original_dst=context.original_dst
            )
            self._never_opened(principal, target, reason)
        self._end(error)

    # ending without a tunnel ------------------------------------------------------------------
    def _never_opened(self, principal: Principal, target: PinnedTarget, reason: str) -> None:
        """The close line of an allowed attempt that never carried a byte, after its allow line,
        so the decision is never left without its outcome."""
        self.opener.audit.never_opened(
            kind=self.surface.kind,
            principal=principal.name,
            host=target.name,
            port=target.port,
            reason=reason,
            target=target,
            **self.context.audit_fields,
        )

    def _refuse(self, error: GatewayError) -> None:
        """A refusal: its deny line (naming what was found so far), the reservation given back,
        the client told as the surface says."""
        self.state = REFUSED
        self._settle()
        principal, context = self.principal, self.context
        self.opener.records.record_deny(
            self.surface.kind,
            principal.name if principal is not None else None,
            self.host_name,
            self.port,
            error=error,
            generation=self.loaded.generation,
            client=context.audit_fields,
            claimed=self.surface.claimed_principal(self) if principal is None else None,
            original_dst=context.original_dst,
        )
        self._end(error)

    def _end(self, error: GatewayError | None) -> None:
        answer = b"" if error is None else self.surface.refusal(error, self.context.audit_fields.get("conn"))
        self.client.attempt_ended(answer)
