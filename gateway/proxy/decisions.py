"""The proxy's decision step: from a parsed request head to a principal, a vetted target, a record.

Owns what every proxy request pays before a byte goes upstream: the credential cache (per policy
generation), the parsed-target and vetted-host caches, and the decision's audit line and
`decisions_total` count. A keep-alive request whose name is in the DNS cache is decided here
without a task, through `EgressCore.pin_cached`; the listener falls back to `EgressCore.pin`
on a miss. The checks are the egress core's, never re-implemented here.

Never dials, never writes to a client, never logs or caches a credential that failed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client import Counter

from gateway.egress.addresses import IPAddress
from gateway.egress.target import PinnedTarget
from gateway.egress.urls import VettedHost, vet_host
from gateway.errors import ErrorCode, GatewayError
from gateway.observe import metrics
from gateway.observe.audit import AuditLog
from gateway.policy.decide import authenticate
from gateway.policy.load import LoadedPolicy
from gateway.policy.model import Principal
from gateway.proxy.forward import ForwardExchange
from gateway.proxy.heads import host_authority, parse_proxy_authorization, split_absolute_target

MAX_CACHED_CREDENTIALS = 1024
MAX_CACHED_HOSTS = 4096
MAX_CACHED_TARGETS = 4096
# Longer request targets are parsed every time: the cache must stay small (4096 entries of at most 512 B).
MAX_CACHED_URL_BYTES = 512

_FORWARD_UP = metrics.HTTP_FORWARD_BYTES.labels("upstream")
_FORWARD_DOWN = metrics.HTTP_FORWARD_BYTES.labels("downstream")


@dataclass(frozen=True, slots=True)
class ForwardTarget:
    """An absolute-form request target, parsed and canonicalised once for every request naming it."""

    host: VettedHost
    port: int
    origin_form: bytes
    authority: bytes


class ProxyDecisions:
    """Caches in front of authentication and host vetting, and the record of each decision."""

    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit
        self._credentials: dict[tuple[int, bytes | None], Principal] = {}
        self._hosts: dict[bytes | str, VettedHost] = {}
        self._targets: dict[bytes, ForwardTarget] = {}
        self._decision_counters: dict[tuple[str, str, str], Counter] = {}
        self._address_texts: dict[tuple[IPAddress, ...], list[str]] = {}
        self._method_names: dict[bytes, str] = {}

    def principal_for(self, loaded: LoadedPolicy, authorization: bytes | None) -> Principal:
        """Authenticate, caching successes per policy generation (hashing every token per request
        would be the single largest cost on a keep-alive connection)."""
        key = (loaded.generation, authorization)
        principal = self._credentials.get(key)
        if principal is None:
            credential = parse_proxy_authorization(authorization)
            principal = authenticate(loaded.policy, credential.user, credential.token)
            if len(self._credentials) >= MAX_CACHED_CREDENTIALS:
                self._credentials.clear()
            self._credentials[key] = principal
        return principal

    def vetted_host(self, raw: bytes | str) -> VettedHost:
        """`vet_host` behind a bounded cache: IDNA canonicalisation costs more than the rest of a
        cached decision, and agents ask for the same few hosts over and over."""
        host = self._hosts.get(raw)
        if host is None:
            if isinstance(raw, bytes):
                try:
                    text = raw.decode("ascii")
                except UnicodeDecodeError:
                    raise GatewayError(ErrorCode.UNSAFE_URL, "the host is not ASCII") from None
            else:
                text = raw
            host = vet_host(text)
            if len(self._hosts) >= MAX_CACHED_HOSTS:
                self._hosts.clear()
            self._hosts[raw] = host
        return host

    def forward_target(self, url: bytes) -> ForwardTarget:
        """Split and vet an absolute URI once; later requests for the same URI reuse the result.

        Only successes are cached, and the result depends on nothing but the URI's bytes (the
        policy decision is made per request by the egress core)."""
        target = self._targets.get(url)
        if target is None:
            split = split_absolute_target(url)
            host = self.vetted_host(split.raw_host)
            target = ForwardTarget(host, split.port, split.origin_form, host_authority(host, split.port))
            if len(url) <= MAX_CACHED_URL_BYTES:
                if len(self._targets) >= MAX_CACHED_TARGETS:
                    self._targets.clear()
                self._targets[url] = target
        return target

    def method_name(self, method: bytes) -> str:
        """The method as audit text (llhttp only accepts known methods, so this stays small)."""
        name = self._method_names.get(method)
        if name is None:
            name = self._method_names[method] = method.decode("ascii", "replace")
        return name

    def address_texts(self, addresses: tuple[IPAddress, ...]) -> list[str]:
        # Formatting an IP address is slow in pure Python; a cached answer is formatted once.
        texts = self._address_texts.get(addresses)
        if texts is None:
            if len(self._address_texts) >= MAX_CACHED_TARGETS:
                self._address_texts.clear()
            texts = self._address_texts[addresses] = [str(a) for a in addresses]
        return texts

    def record_exchange_close(self, exchange: ForwardExchange, reason: str) -> None:
        """The close audit line of a forwarded request (none for a request that was never allowed)."""
        target = exchange.target
        if target is not None:
            _FORWARD_UP.inc(exchange.bytes_up)
            _FORWARD_DOWN.inc(exchange.bytes_down)
            self.audit.write(
                "close", kind="http", principal=exchange.principal, host=target.name, port=target.port,
                bytes_up=exchange.bytes_up, bytes_down=exchange.bytes_down,
                duration_s=round(time.perf_counter() - exchange.started, 6), close_reason=reason,
            )

    def count_decision(self, kind: str, decision: str, code: str) -> None:
        key = (kind, decision, code)
        counter = self._decision_counters.get(key)
        if counter is None:
            counter = self._decision_counters[key] = metrics.DECISIONS.labels(kind, decision, code)
        counter.inc()

    def record_allow(self, kind: str, principal: Principal, target: PinnedTarget, *,
                     address_texts: list[str] | None = None, **extra: object) -> None:
        """`address_texts`: `target.addresses` already formatted by the caller (saves a lookup)."""
        would = target.would_deny
        decision = "would_deny" if would is not None else "allow"
        code = str(would.code) if would is not None else ""
        self.count_decision(kind, decision, code)
        self.audit.decision(
            kind=kind, principal=principal.name, host=target.name, port=target.port,
            addresses=address_texts if address_texts is not None else self.address_texts(target.addresses),
            decision=decision, code=code or None,
            reason=would.message if would is not None else None, generation=target.generation,
            **extra,
        )

    def record_deny(self, kind: str, principal: str | None, host: str | None, port: int | None, *,
                    error: GatewayError, generation: int) -> None:
        self.count_decision(kind, "deny", str(error.code))
        self.audit.decision(
            kind=kind, principal=principal, host=host, port=port, decision="deny", code=str(error.code),
            reason=error.message, generation=generation,
        )
