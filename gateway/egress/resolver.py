"""Name resolution with aiodns: A and AAAA, CNAME chains, a bounded TTL cache, a lookup timeout.

The resolver only answers what a name resolves to; it does not judge the answers (the address
guard does, on every answer). No search domains are ever applied: `query` asks for the exact
name, so `kubernetes.default` is never quietly expanded to a cluster service. Callers that ask
for a name while its lookup is in flight share that lookup: a burst of CONNECTs to a new name
sends one A and one AAAA query, not a pair per CONNECT.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import aiodns
import aiodns.error
import pycares

from gateway.errors import ErrorCode, GatewayError
from gateway.tasks import spawn
from gateway.vet.addresses import IPAddress
from gateway.vet.urls import refused_name_reason

MAX_CACHED_NAMES = 4096
MAX_CACHE_TTL_S = 300.0
MAX_CNAME_CHAIN = 8


@dataclass(frozen=True, slots=True)
class Resolution:
    name: str
    addresses: tuple[IPAddress, ...]
    cname_chain: tuple[str, ...]
    ttl_s: float
    duration_s: float
    cached: bool = False


_FAILURE_REASONS = MappingProxyType(
    {
        pycares.errno.ARES_ENOTFOUND: "NXDOMAIN",
        pycares.errno.ARES_ESERVFAIL: "SERVFAIL",
        pycares.errno.ARES_ETIMEOUT: "timed out",
        pycares.errno.ARES_EREFUSED: "REFUSED",
        pycares.errno.ARES_ECONNREFUSED: "nameserver refused the connection",
        pycares.errno.ARES_ENODATA: "no A/AAAA answer",
    }
)


class Resolver:
    """aiodns resolution with a bounded cache. One per process; created inside the loop."""

    def __init__(
        self,
        nameservers: Sequence[str] = (),
        *,
        timeout_s: float = 3.0,
        tries: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._dns = aiodns.DNSResolver(nameservers=list(nameservers) or None, timeout=timeout_s, tries=tries)
        self._timeout_s = timeout_s * tries + 1.0
        self._cache: OrderedDict[str, tuple[float, Resolution]] = OrderedDict()
        self._clock = clock
        self._in_flight: dict[str, asyncio.Task[Resolution]] = {}

    async def close(self) -> None:
        await self._dns.close()

    def cached(self, name: str) -> Resolution | None:
        """The unexpired cached answer for `name`, or None; never queries and never awaits, so a
        caller on a hot path can decide without a task when the cache answers."""
        entry = self._fresh(name)
        if entry is None:
            return None
        expires, resolution = entry
        return Resolution(
            resolution.name, resolution.addresses, resolution.cname_chain, expires - self._clock(), 0.0, cached=True
        )

    def cached_addresses(self, name: str) -> tuple[IPAddress, ...] | None:
        """`cached(name).addresses` without building a `Resolution` (the proxy asks per CONNECT and
        per request)."""
        entry = self._fresh(name)
        return entry[1].addresses if entry is not None else None

    def _fresh(self, name: str) -> tuple[float, Resolution] | None:
        entry = self._cache.get(name)
        if entry is None:
            return None
        if self._clock() >= entry[0]:
            del self._cache[name]
            return None
        self._cache.move_to_end(name)
        return entry

    def _store(self, resolution: Resolution) -> None:
        if resolution.ttl_s <= 0:
            return
        self._cache[resolution.name] = (self._clock() + min(resolution.ttl_s, MAX_CACHE_TTL_S), resolution)
        self._cache.move_to_end(resolution.name)
        while len(self._cache) > MAX_CACHED_NAMES:
            self._cache.popitem(last=False)

    async def _query(self, name: str, qtype: str) -> tuple[list[IPAddress], list[str], float, int | None]:
        try:
            result = await self._dns.query_dns(name, qtype)
        except aiodns.error.DNSError as exc:
            errno = exc.args[0] if exc.args else None
            return [], [], 0.0, errno if isinstance(errno, int) else pycares.errno.ARES_ESERVFAIL
        addresses: list[IPAddress] = []
        cnames: list[str] = []
        ttls: list[int] = []
        for record in result.answer:
            data = record.data
            if isinstance(data, pycares.ARecordData | pycares.AAAARecordData):
                try:
                    addresses.append(ipaddress.ip_address(data.addr))
                except ValueError:
                    continue
                ttls.append(record.ttl)
            elif isinstance(data, pycares.CNAMERecordData):
                cnames.append(data.cname.rstrip(".").lower())
                ttls.append(record.ttl)
        return addresses, cnames, float(min(ttls)) if ttls else 0.0, None

    async def resolve(self, name: str) -> Resolution:
        """Every A and AAAA answer for `name`, or `dns_failure` with a distinct reason."""
        cached = self.cached(name)
        if cached is not None:
            return cached
        lookup = self._in_flight.get(name)
        if lookup is None:
            lookup = spawn(self._lookup(name), name=f"dns {name}")
            self._in_flight[name] = lookup
            lookup.add_done_callback(lambda done: self._lookup_done(name, done))
        # Shielded: a caller that gives up (its own deadline, its client gone) must not cancel the
        # lookup the others wait on; the lookup ends by itself within its timeout.
        return await asyncio.shield(lookup)

    def _lookup_done(self, name: str, lookup: asyncio.Task[Resolution]) -> None:
        if self._in_flight.get(name) is lookup:
            del self._in_flight[name]
        if not lookup.cancelled():
            lookup.exception()  # retrieved: every waiter may have left before it ended

    async def _lookup(self, name: str) -> Resolution:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeout_s):
                (v4, c4, ttl4, err4), (v6, c6, ttl6, err6) = await asyncio.gather(
                    self._query(name, "A"), self._query(name, "AAAA")
                )
        except TimeoutError:
            raise GatewayError(ErrorCode.DNS_FAILURE, f"DNS lookup for {name} timed out") from None
        duration = time.perf_counter() - started
        chain = tuple(dict.fromkeys(c4 + c6))
        if len(chain) > MAX_CNAME_CHAIN:
            raise GatewayError(ErrorCode.DNS_FAILURE, f"{name} has a CNAME chain longer than {MAX_CNAME_CHAIN}")
        for target in chain:
            reason = refused_name_reason(target)
            if reason is not None:
                raise GatewayError(
                    ErrorCode.BLOCKED_DESTINATION,
                    f"{name} is an alias of {target}: {reason}",
                    rule="builtin_names",
                    rule_pattern=target,
                )
        addresses = tuple(dict.fromkeys(v4 + v6))
        if not addresses:
            errors = [e for e in (err4, err6) if e is not None and e != pycares.errno.ARES_ENODATA]
            reason = _FAILURE_REASONS.get(errors[0], f"resolver error {errors[0]}") if errors else "no A/AAAA answer"
            # NXDOMAIN and an empty answer say the same thing on a retry (the name is wrong);
            # SERVFAIL, REFUSED and timeouts may pass.
            permanent = not errors or errors[0] == pycares.errno.ARES_ENOTFOUND
            raise GatewayError(ErrorCode.DNS_FAILURE, f"DNS lookup for {name} failed: {reason}", permanent=permanent)
        ttls = [t for t, got in ((ttl4, v4), (ttl6, v6)) if got]
        resolution = Resolution(name, addresses, chain, min(ttls), duration)
        self._store(resolution)
        return resolution
