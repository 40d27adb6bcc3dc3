"""The caches in front of the proxy's decision: who is asking, and what a request target names.

Owns what every proxy request pays before the egress core decides: the credential cache (per
policy generation), the vetted-host, parsed-target and CONNECT-authority caches, and the audit
text of each method. Each cache keeps successes only, and each result depends on nothing but its
key (the policy decision itself is made per request by the egress core). The decision's audit
lines are `records.py`'s.

Never dials, never writes to a client or the audit log, never caches a credential that failed.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import ErrorCode, GatewayError
from gateway.memo import BoundedMemo
from gateway.policy.decide import authenticate_bound
from gateway.policy.model import LoadedPolicy, Principal
from gateway.proxy.http1.heads import (
    Authority,
    host_authority,
    parse_connect_authority,
    parse_proxy_authorization,
    split_absolute_target,
)
from gateway.vet.urls import VettedHost, vet_host

MAX_CACHED_CREDENTIALS = 1024
MAX_CACHED_HOSTS = 4096
MAX_CACHED_TARGETS = 4096
# Longer request targets are parsed every time: the cache must stay small (4096 entries of at most 512 B).
MAX_CACHED_URL_BYTES = 512


@dataclass(frozen=True, slots=True)
class ForwardTarget:
    """An absolute-form request target, parsed and canonicalised once for every request naming it."""

    host: VettedHost
    port: int
    origin_form: bytes
    authority: bytes


class DecisionCaches:
    """Caches in front of authentication, host vetting and request-target parsing."""

    def __init__(self) -> None:
        self._credentials: BoundedMemo[tuple[int, bytes | None, int | None], Principal] = BoundedMemo(
            MAX_CACHED_CREDENTIALS
        )
        self._hosts: BoundedMemo[bytes | str, VettedHost] = BoundedMemo(MAX_CACHED_HOSTS)
        self._targets: BoundedMemo[bytes, ForwardTarget] = BoundedMemo(MAX_CACHED_TARGETS)
        self._authorities: BoundedMemo[bytes, Authority] = BoundedMemo(MAX_CACHED_TARGETS)
        self._method_names: dict[bytes, str] = {}

    def principal_for(
        self, loaded: LoadedPolicy, authorization: bytes | None, peer_uid: int | None = None
    ) -> Principal:
        """Authenticate, caching successes per policy generation (hashing every token per request
        would be the single largest cost on a keep-alive connection). `peer_uid`: the uid behind a
        loopback client when the policy binds uids (`authenticate_bound`), else None."""
        key = (loaded.generation, authorization, peer_uid)
        principal = self._credentials.get(key)
        if principal is None:
            credential = parse_proxy_authorization(authorization)
            bound = authenticate_bound(loaded.policy, credential.user, credential.token, peer_uid)
            principal = self._credentials.put(key, bound)
        return principal

    @staticmethod
    def claimed_principal(authorization: bytes | None) -> str | None:
        """The user part of a Basic credential that failed, for the audit line (a burst of failures
        for one name is an attack on that principal); never the token, None for Bearer or garbage."""
        try:
            return parse_proxy_authorization(authorization).user
        except GatewayError:
            return None

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
            host = self._hosts.put(raw, vet_host(text, keep_internal=True))
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
                self._targets.put(url, target)
        return target

    def connect_authority(self, raw: bytes) -> Authority:
        """`parse_connect_authority` once per distinct CONNECT target; only successes are cached,
        and the result depends on nothing but the target's bytes."""
        authority = self._authorities.get(raw)
        if authority is None:
            authority = parse_connect_authority(raw, self.vetted_host)
            if len(raw) <= MAX_CACHED_URL_BYTES:
                self._authorities.put(raw, authority)
        return authority

    def method_name(self, method: bytes) -> str:
        """The method as audit text (llhttp only accepts known methods, so this stays small)."""
        name = self._method_names.get(method)
        if name is None:
            name = self._method_names[method] = method.decode("ascii", "replace")
        return name
