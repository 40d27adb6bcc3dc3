"""Classify an IP address: allowed, or the named range that denies it.

An explicit table, not `ipaddress.is_global`/`is_private`: Python 3.11 calls 192.0.0.192 (Oracle
metadata), 64:ff9b::a9fe:a9fe (NAT64 of 169.254.169.254), 2002:a9fe:a9fe:: (6to4 of it),
::127.0.0.1 and fec0::1 global. IPv4-embedding IPv6 forms are unpacked and the embedded IPv4 is
classified too, because a NAT64 gateway or a dual-stack kernel will deliver to it.

Pure: takes values, returns verdicts. Never resolves a name, never opens a socket.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# (network, why it is denied). Most specific entries first is not needed: lookup picks the
# longest matching prefix.
BUILTIN_DENIED_V4: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "this-network"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "CGNAT, includes Alibaba metadata 100.100.100.200"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local, cloud metadata"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments, includes Oracle metadata 192.0.0.192"),
    ("192.0.2.0/24", "documentation TEST-NET-1"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation TEST-NET-2"),
    ("203.0.113.0/24", "documentation TEST-NET-3"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("255.255.255.255/32", "broadcast"),
    ("168.63.129.16/32", "Azure platform endpoint"),
)

# Only 2000::/3 can be allowed at all; these are the denials inside it.
GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")
BUILTIN_DENIED_V6_INSIDE_GLOBAL: tuple[tuple[str, str], ...] = (
    ("2001::/23", "IETF protocol assignments, includes Teredo 2001::/32"),
    ("2001:db8::/32", "documentation"),
    ("2002::/16", "6to4"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "segment routing SIDs"),
)
# Named for the reason only: everything outside 2000::/3 is denied whatever it is.
NAMED_V6_OUTSIDE_GLOBAL: tuple[tuple[str, str], ...] = (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::ffff:0:0/96", "IPv4-mapped"),
    ("::/96", "IPv4-compatible"),
    ("64:ff9b::/96", "NAT64"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard-only"),
    ("fc00::/7", "unique local, includes AWS fd00:ec2::254 and GCP fd20:ce::254"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
)

TEREDO = ipaddress.IPv6Network("2001::/32")
SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
COMPATIBLE = ipaddress.IPv6Network("::/96")


@dataclass(frozen=True, slots=True)
class AddressVerdict:
    address: IPAddress
    allowed: bool
    reason: str
    # The rule that decided, for the audit line: `builtin_ranges`, `defaults.deny_cidrs[0]`, ...
    # and its CIDR; None for a public address no rule names.
    rule: str | None = None
    pattern: str | None = None


@dataclass(frozen=True, slots=True)
class _Rule:
    network: IPNetwork
    allow: bool
    label: str
    # On an equal prefix the higher rank wins: policy deny_cidrs (2) over policy allow_cidrs (1)
    # over the built-in table (0), so an allow_cidrs entry equal to a built-in range is the
    # exception it says it is, and a deny/allow tie in the policy resolves to deny.
    rank: int = 0
    name: str = "builtin_ranges"


class _PrefixTable:
    """Longest-prefix match over a fixed rule set, precomputed per prefix length.

    Networks of one prefix length never overlap, so each level is a dict keyed by the masked
    address: a lookup costs one dict probe per distinct prefix length.
    """

    def __init__(self, rules: Iterable[_Rule], bits: int) -> None:
        levels: dict[int, dict[int, _Rule]] = {}
        for rule in rules:
            net = rule.network
            level = levels.setdefault(net.prefixlen, {})
            key = int(net.network_address) >> (bits - net.prefixlen)
            existing = level.get(key)
            if existing is None or rule.rank > existing.rank:
                level[key] = rule
        self._bits = bits
        self._levels = sorted(levels.items(), reverse=True)

    def match(self, value: int) -> _Rule | None:
        for prefix, level in self._levels:
            rule = level.get(value >> (self._bits - prefix))
            if rule is not None:
                return rule
        return None


def embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 form carries, with the form's name, if it carries one."""
    if address in MAPPED:
        mapped = address.ipv4_mapped
        assert mapped is not None
        return "IPv4-mapped", mapped
    if address in NAT64_WELL_KNOWN:
        return "NAT64", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in NAT64_LOCAL:
        return "local-use NAT64", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in TEREDO:
        teredo = address.teredo
        assert teredo is not None
        # The client address is the last 32 bits XOR-ed with all ones (RFC 4380 section 4).
        return "Teredo", teredo[1]
    if address in SIX_TO_FOUR:
        sixtofour = address.sixtofour
        assert sixtofour is not None
        return "6to4", sixtofour
    if address in COMPATIBLE and int(address) > 1:
        return "IPv4-compatible", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _builtin_rules() -> list[_Rule]:
    rules = [
        _Rule(ipaddress.ip_network(cidr), False, f"{cidr} ({why})")
        for cidr, why in BUILTIN_DENIED_V4 + BUILTIN_DENIED_V6_INSIDE_GLOBAL
    ]
    rules.extend(_Rule(ipaddress.ip_network(cidr), False, f"{cidr} ({why})") for cidr, why in NAMED_V6_OUTSIDE_GLOBAL)
    return rules


def _outside_global_reason(address: ipaddress.IPv6Address) -> str:
    best: tuple[int, str] | None = None
    for cidr, why in NAMED_V6_OUTSIDE_GLOBAL:
        net = ipaddress.IPv6Network(cidr)
        if address in net and (best is None or net.prefixlen > best[0]):
            best = (net.prefixlen, f"{cidr} ({why})")
    return best[1] if best else "outside 2000::/3 (not global unicast)"


def parse_networks(cidrs: Iterable[str]) -> tuple[IPNetwork, ...]:
    """Parse CIDR strings strictly; a host-bits-set network is a configuration error."""
    return tuple(ipaddress.ip_network(cidr, strict=True) for cidr in cidrs)


class AddressGuard:
    """The built-in deny table plus a policy's allow/deny exceptions, precomputed.

    Order (documented in docs/reference/policy.md): the most specific matching prefix wins among built-in
    denials, policy `deny_cidrs` and policy `allow_cidrs`; on an equal prefix `deny_cidrs` beats
    `allow_cidrs`, which beats the built-in table. IPv6 outside
    2000::/3 and IPv4-embedding forms whose IPv4 is denied stay denied unless an allow rule names
    the IPv6 prefix itself more specifically.
    """

    def __init__(
        self,
        allow_cidrs: Sequence[IPNetwork] = (),
        deny_cidrs: Sequence[IPNetwork] = (),
        self_addresses: Sequence[IPAddress | IPNetwork] = (),
    ) -> None:
        # Single addresses in a set (the common case: a listener on one address); whole ranges
        # (127.0.0.0/8 behind a wildcard listener) checked one by one, there are only a few.
        self._self_addresses = frozenset(
            a for a in self_addresses if not isinstance(a, ipaddress.IPv4Network | ipaddress.IPv6Network)
        )
        self._self_networks = tuple(
            a for a in self_addresses if isinstance(a, ipaddress.IPv4Network | ipaddress.IPv6Network)
        )
        base = _builtin_rules()
        base.extend(
            _Rule(net, False, f"{net} (policy deny_cidrs)", rank=2, name=f"defaults.deny_cidrs[{index}]")
            for index, net in enumerate(deny_cidrs)
        )
        policy_allow = [
            _Rule(net, True, f"{net} (policy allow_cidrs)", rank=1, name=f"defaults.allow_cidrs[{index}]")
            for index, net in enumerate(allow_cidrs)
        ]
        self._v4 = _PrefixTable((r for r in base + policy_allow if r.network.version == 4), 32)
        self._v6 = _PrefixTable((r for r in base + policy_allow if r.network.version == 6), 128)

    def vet(self, address: IPAddress, *, extra_allow: Sequence[IPNetwork] = ()) -> AddressVerdict:
        """Allowed, or denied with the range named. `extra_allow` is a per-host exception."""
        verdict = self._vet_ranges(address, extra_allow)
        if verdict.allowed and (
            address in self._self_addresses
            or any(address.version == net.version and address in net for net in self._self_networks)
        ):
            return AddressVerdict(
                address, False, f"{address} is an address of the gateway's own listeners", "own_addresses", str(address)
            )
        return verdict

    def _vet_ranges(self, address: IPAddress, extra_allow: Sequence[IPNetwork]) -> AddressVerdict:
        for net in extra_allow:
            if address.version == net.version and address in net:
                return AddressVerdict(
                    address, True, f"{address} allowed by host rule {net}", "internal_hosts", str(net)
                )
        if isinstance(address, ipaddress.IPv4Address):
            return self._vet_v4(address)
        return self._vet_v6(address)

    def _vet_v4(self, address: ipaddress.IPv4Address) -> AddressVerdict:
        rule = self._v4.match(int(address))
        if rule is None:
            return AddressVerdict(address, True, f"{address} is public")
        if rule.allow:
            return AddressVerdict(address, True, f"{address} allowed by {rule.label}", rule.name, str(rule.network))
        return AddressVerdict(address, False, f"{address} is in {rule.label}", rule.name, str(rule.network))

    def _vet_v6(self, address: ipaddress.IPv6Address) -> AddressVerdict:
        if address.scope_id:
            address = ipaddress.IPv6Address(address.compressed.split("%", 1)[0])
        rule = self._v6.match(int(address))
        if rule is not None and rule.allow:
            return AddressVerdict(address, True, f"{address} allowed by {rule.label}", rule.name, str(rule.network))
        embedded = embedded_ipv4(address)
        if embedded is not None:
            form, inner = embedded
            inner_verdict = self._vet_v4(inner)
            where = f"{form} {rule.label}" if rule else form
            return AddressVerdict(
                address,
                False,
                f"{address} is in {where}, embedding IPv4 {inner}"
                + ("" if inner_verdict.allowed else f" ({inner_verdict.reason})"),
                rule.name if rule else "builtin_ranges",
                str(rule.network) if rule else None,
            )
        if rule is not None:
            return AddressVerdict(address, False, f"{address} is in {rule.label}", rule.name, str(rule.network))
        if address not in GLOBAL_UNICAST_V6:
            return AddressVerdict(
                address, False, f"{address} is in {_outside_global_reason(address)}", "builtin_ranges", None
            )
        return AddressVerdict(address, True, f"{address} is public")
