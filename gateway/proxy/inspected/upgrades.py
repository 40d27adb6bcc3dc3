"""The upgrade requests (WebSocket) of one inspected connection: judged, screened, then relayed.

Owns `InspectedUpgrades`, the `client_connection.Upgrades` of an inspected connection: an
upgrade request is judged by the request rules as any request inside it (the same request
hook, under the policy in force when its head arrived), its head goes through the outbound
guard (a placeholder or secret refused, a bound credential injected, a scrubber for the answer,
issue 26), and the connection's transport is handed to an `relay.UpgradeRelay` dialed to the
pinned address over TLS (the gateway's trust store). It writes the upgrade's one audit line when
the relay closes.

Never parses WebSocket frames (the relay moves bytes), never relays an upgrade that was
pipelined behind another request or that carries a body, never trusts the interception CA
upstream.
"""

from __future__ import annotations

from gateway.credentials.inject import Scrubber
from gateway.credentials.screen import RequestFacts as OutboundFacts
from gateway.egress.connect import open_pinned_connection
from gateway.errors import ErrorCode, GatewayError
from gateway.inspect.request_hook import InspectedRequest, judge_inspected_request
from gateway.observe import metrics
from gateway.policy.model import LoadedPolicy, Principal
from gateway.proxy.client_connection import ClientConnection
from gateway.proxy.http1.heads import error_response
from gateway.proxy.http1.request_framing import UpgradeHead
from gateway.proxy.inspected.listener import InspectListener
from gateway.proxy.inspected.relay import (
    RelayClientSide,
    RelayOutcome,
    UpgradeRelay,
    upgrade_fields,
    upstream_upgrade_head,
)
from gateway.proxy.inspected.requests import KIND, TLS_DEFAULT_PORT, InspectedRequests, write_inspected_close
from gateway.tasks import spawn


class InspectedUpgrades:
    """`Upgrades` of one inspected connection: its principal, host and port are its surface's."""

    def __init__(self, listener: InspectListener, surface: InspectedRequests) -> None:
        self.listener = listener
        self.surface = surface

    def refused_with_body(self) -> GatewayError:
        # Only an upgrade with a body gets here (a WebSocket handshake has none).
        return GatewayError(
            ErrorCode.INSPECTION_UNSUPPORTED,
            f"{self.surface.host} is inspected and only bodiless upgrade requests (WebSocket) are relayed",
        )

    def take_over(self, client: ClientConnection, head: UpgradeHead) -> RelayClientSide:
        """Judge the upgrade request by the rules; if allowed, relay it on a pinned TLS upstream."""
        listener, surface = self.listener, self.surface
        loaded = listener.core.policy.current
        method = head.method.decode("latin-1")
        url = head.url.decode("latin-1")
        path = url.partition("?")[0]
        try:
            if client.busy:
                raise GatewayError(
                    ErrorCode.INSPECTION_UNSUPPORTED, "an upgrade pipelined behind another request is not relayed"
                )
            principal = surface.principal_for(loaded)
            lines = head.head.split(b"\r\n")[1:]
            headers = tuple(
                (name.decode("latin-1").strip(), value.decode("latin-1").strip())
                for name, _, value in (line.partition(b":") for line in lines if line)
            )
            request = InspectedRequest(surface.host, surface.port, True, method, url, headers, b"")
            judgement = judge_inspected_request(loaded.policy, principal, request)
            path = judgement.verdict.path
            if judgement.verdict.verdict == "deny":
                raise judgement.verdict.refusal()
            fields, scrubber = self._guard(head, judgement.origin_form, principal, loaded, method)
        except GatewayError as error:
            metrics.INSPECTED_REQUESTS.labels("deny", str(error.code)).inc()
            listener.records.record_deny(
                KIND,
                surface.principal,
                surface.host,
                surface.port,
                error=error,
                generation=loaded.generation,
                client=client.audit_fields,
                method=method,
                path=path,
            )
            raise
        upgrade = next((value for name, value in headers if name.lower() == "upgrade"), "")[:32].lower()
        verdict = judgement.verdict
        proxy = loaded.policy.proxy
        audit_fields = client.audit_fields

        def closed(outcome: RelayOutcome) -> None:
            listener.relays.discard(relay)
            write_inspected_close(
                listener.audit,
                principal=surface.principal,
                host=surface.host,
                port=surface.port,
                address=outcome.address or None,
                method=method,
                path=path,
                status=outcome.status,
                upgrade=upgrade or None,
                bytes_up=outcome.bytes_up,
                bytes_down=outcome.bytes_down,
                duration_s=outcome.duration_s,
                verdict=verdict.verdict,
                rule=verdict.rule,
                reason=outcome.reason,
                generation=loaded.generation,
                audit_fields=audit_fields,
            )
            listener.activity_ended()  # wakes a drain waiting for this relay

        relay = UpgradeRelay(
            client.transport,
            upstream_upgrade_head(head.head, judgement.origin_form.encode(), fields),
            idle_timeout_s=proxy.idle_timeout_s,
            lifetime_s=proxy.max_tunnel_lifetime_s,
            on_close=closed,
            scrubber=scrubber,
        )
        listener.relays.add(relay)
        if head.rest:
            relay.from_client(head.rest)
        conn = audit_fields.get("conn")
        spawn(self._dial(relay, principal, loaded, conn), name="inspect-upgrade", loop=listener.loop)
        return RelayClientSide(relay)

    def _guard(
        self, head: UpgradeHead, origin_form: str, principal: Principal, loaded: LoadedPolicy, method: str
    ) -> tuple[bytes, Scrubber | None]:
        """The upgrade head through the outbound guard, as the dispatcher sends a request's: URL
        and fields screened (a placeholder or secret raises the refusal, its `security` line
        written), a bound credential injected, a scrubber for the answer. Nothing is sent yet."""
        fields = upgrade_fields(head.head)
        guard = self.listener.proxy.dispatcher.guard
        if guard is None:
            return fields, None
        surface = self.surface
        facts = OutboundFacts(
            KIND, principal.name, "https", surface.host, surface.port, method, origin_form.partition("?")[0]
        )
        url = b"https://%b:%d%b" % (surface.host.encode("ascii"), surface.port, origin_form.encode())
        return guard.guard_head(facts, loaded.policy, principal, url=url, fields=fields, generation=loaded.generation)

    async def _dial(self, relay: UpgradeRelay, principal: Principal, loaded: LoadedPolicy, conn: object) -> None:
        surface = self.surface
        try:
            forward = surface.forward_target(b"https://%b:%d/" % (surface.host.encode("ascii"), surface.port))
            target = await self.listener.core.pin(principal, forward.host, forward.port, loaded=loaded)
            context = await surface.upstream_tls()
            _, _, address = await open_pinned_connection(
                target, lambda: relay, timeout_s=loaded.policy.proxy.connect_timeout_s, tls=context
            )
        except GatewayError as error:
            if not relay.closed:
                relay.client.write(
                    error_response(
                        error,
                        keep_alive=False,
                        conn=conn,
                        default_port=TLS_DEFAULT_PORT,
                    )
                )
            relay.close(str(error.code))
            return
        relay.address = address
        if relay.client.is_closing():
            relay.close("client_gone")
