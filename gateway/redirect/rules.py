"""The pod's interception rules as text: one nftables table of our own, or iptables-restore input.

What the rules do, in order, for every uid but the gateway's (which is exempt from all of it, so
the gateway's own connections never loop back into itself):
- TCP and UDP to port 53 go to the DNS listener (the uid's own port when the policy lists it);
- loopback destinations and the excluded CIDRs and TCP ports are left alone;
- every other TCP connection goes to the transparent listener (again the uid's own port);
- in the filter hook, a packet conntrack calls invalid is dropped: once the kernel has forgotten
  a connection the gateway refused, the agent's next segment on that socket (data, FIN, a bare
  RST) is no longer redirected, and it must not leave the pod with the address the agent chose;
- each uid reaches only its own listener ports among the gateway's transparent and DNS ports
  (the port is the principal: another uid's port would lend that uid's verdicts);
- what is left leaves only as part of a flow the rules made (redirected to loopback, excluded,
  the answer to a connection from outside) or as ICMP; everything else is dropped, so nothing
  leaves the pod except through the gateway.

Pure: settings in, text out. Never runs a command (apply.py does).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.transparent.ports import PortAssignment

NFT_TABLE = "egress_gateway"
IPT_CHAIN = "EGRESS_GW_OUTPUT"
LOOPBACK_V4 = "127.0.0.0/8"
LOOPBACK_V6 = "::1/128"


@dataclass(frozen=True, slots=True)
class RedirectPlan:
    gateway_uid: int
    tcp_ports: tuple[PortAssignment, ...]
    dns_ports: tuple[PortAssignment, ...]
    exclude_cidrs: tuple[str, ...] = ()
    exclude_ports: tuple[int, ...] = ()

    def cidrs(self, version: int) -> list[str]:
        return [c for c in self.exclude_cidrs if ipaddress.ip_network(c).version == version]


def _by_uid_first(assignments: Sequence[PortAssignment]) -> list[PortAssignment]:
    """Listed uids first (each its own port), then the catch-all for every other uid."""
    return [a for a in assignments if a.uid is not None] + [a for a in assignments if a.uid is None]


def _nft_set(items: Sequence[str | int]) -> str:
    return "{ " + ", ".join(str(i) for i in items) + " }"


def _port_guard(plan: RedirectPlan) -> list[tuple[int | None, list[int]]]:
    """(uid, its own transparent and DNS ports): listed uids first, then every other uid's."""
    tcp = {a.uid: a.port for a in plan.tcp_ports}
    dns = {a.uid: a.port for a in plan.dns_ports}
    owners = [a.uid for a in _by_uid_first(plan.tcp_ports)]
    return [(owner, sorted({tcp[owner], *([dns[owner]] if owner in dns else [])})) for owner in owners]


def _gateway_ranges(plan: RedirectPlan) -> list[str]:
    """Every port a principal owns, as ranges: assign_ports numbers each kind contiguously."""
    ranges = []
    for assignments in (plan.tcp_ports, plan.dns_ports):
        if assignments:
            low, high = min(a.port for a in assignments), max(a.port for a in assignments)
            ranges.append(f"{low}-{high}" if high > low else str(low))
    return ranges


def render_nft(plan: RedirectPlan) -> str:
    """An `nft -f` script that replaces our table atomically (declare, delete, define: idempotent)."""
    uid = plan.gateway_uid
    nat = [f"meta skuid {uid} return"]
    for assignment in _by_uid_first(plan.dns_ports):
        owner = f"meta skuid {assignment.uid} " if assignment.uid is not None else ""
        nat.append(f"{owner}meta l4proto {{ tcp, udp }} th dport 53 redirect to :{assignment.port}")
    nat += [f"ip daddr {LOOPBACK_V4} return", f"ip6 daddr {LOOPBACK_V6} return"]
    v4, v6 = plan.cidrs(4), plan.cidrs(6)
    if v4:
        nat.append(f"ip daddr {_nft_set(v4)} return")
    if v6:
        nat.append(f"ip6 daddr {_nft_set(v6)} return")
    if plan.exclude_ports:
        nat.append(f"tcp dport {_nft_set(sorted(plan.exclude_ports))} return")
    for assignment in _by_uid_first(plan.tcp_ports):
        owner = f"meta skuid {assignment.uid} " if assignment.uid is not None else ""
        nat.append(f"{owner}meta l4proto tcp redirect to :{assignment.port}")
    # By destination, not `oifname "lo"`: the output device of one hook pass is the one routed before
    # the nat chain redirected the packet, so a redirected DNS datagram still names the pod's NIC.
    filt = [f"meta skuid {uid} accept", "ct state invalid counter drop"]
    gateway_ports = _nft_set(_gateway_ranges(plan))
    for guarded_uid, own_ports in _port_guard(plan):
        who = f"meta skuid {guarded_uid} " if guarded_uid is not None else ""
        for daddr in (f"ip daddr {LOOPBACK_V4}", f"ip6 daddr {LOOPBACK_V6}"):
            filt.append(f"{who}{daddr} meta l4proto {{ tcp, udp }} th dport {_nft_set(own_ports)} accept")
            filt.append(f"{who}{daddr} meta l4proto {{ tcp, udp }} th dport {gateway_ports} drop")
    # Answers to connections made from outside (a probe, a port the agent serves) are theirs to send.
    filt += ["ct direction reply accept", f"ip daddr {LOOPBACK_V4} accept", f"ip6 daddr {LOOPBACK_V6} accept"]
    if v4:
        filt.append(f"ip daddr {_nft_set(v4)} accept")
    if v6:
        filt.append(f"ip6 daddr {_nft_set(v6)} accept")
    if plan.exclude_ports:
        filt.append(f"tcp dport {_nft_set(sorted(plan.exclude_ports))} accept")
    # TCP that reaches this point was neither redirected nor excluded (a segment conntrack picked up
    # mid-stream that no redirect applied to). ICMP carries errors and IPv6 neighbour discovery.
    filt += ["meta l4proto { icmp, ipv6-icmp } accept", "counter drop"]
    lines = [
        f"table inet {NFT_TABLE} {{}}",
        f"delete table inet {NFT_TABLE}",
        f"table inet {NFT_TABLE} {{",
        "  chain nat_output {",
        "    type nat hook output priority -100; policy accept;",
        *(f"    {rule}" for rule in nat),
        "  }",
        "  chain filter_output {",
        "    type filter hook output priority 0; policy accept;",
        *(f"    {rule}" for rule in filt),
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def render_nft_remove() -> str:
    """Delete our table, whether or not it exists (declaring it first makes the delete safe)."""
    return f"table inet {NFT_TABLE} {{}}\ndelete table inet {NFT_TABLE}\n"


def render_iptables(plan: RedirectPlan, version: int) -> str:
    """`iptables-restore --noflush` input (version 4) or `ip6tables-restore` input (version 6).

    Only our own chain is declared (which flushes it); apply.py adds the one jump from OUTPUT.
    """
    uid = plan.gateway_uid
    chain = IPT_CHAIN
    nat = [f"-A {chain} -m owner --uid-owner {uid} -j RETURN"]
    for assignment in _by_uid_first(plan.dns_ports):
        owner = f" -m owner --uid-owner {assignment.uid}" if assignment.uid is not None else ""
        for proto in ("udp", "tcp"):
            nat.append(f"-A {chain} -p {proto} --dport 53{owner} -j REDIRECT --to-ports {assignment.port}")
    loopback = LOOPBACK_V4 if version == 4 else LOOPBACK_V6
    excluded = plan.cidrs(version)
    nat.append(f"-A {chain} -d {loopback} -j RETURN")
    nat += [f"-A {chain} -d {cidr} -j RETURN" for cidr in excluded]
    nat += [f"-A {chain} -p tcp --dport {port} -j RETURN" for port in sorted(plan.exclude_ports)]
    for assignment in _by_uid_first(plan.tcp_ports):
        owner = f" -m owner --uid-owner {assignment.uid}" if assignment.uid is not None else ""
        nat.append(f"-A {chain} -p tcp{owner} -j REDIRECT --to-ports {assignment.port}")
    icmp = "icmp" if version == 4 else "ipv6-icmp"
    filt = [
        f"-A {chain} -m owner --uid-owner {uid} -j ACCEPT",
        f"-A {chain} -m conntrack --ctstate INVALID -j DROP",
    ]
    gateway_ports = ",".join(r.replace("-", ":") for r in _gateway_ranges(plan))
    for guarded_uid, own_ports in _port_guard(plan):
        who = f" -m owner --uid-owner {guarded_uid}" if guarded_uid is not None else ""
        own = ",".join(str(p) for p in own_ports)
        for proto in ("tcp", "udp"):
            filt.append(f"-A {chain}{who} -d {loopback} -p {proto} -m multiport --dports {own} -j ACCEPT")
            filt.append(f"-A {chain}{who} -d {loopback} -p {proto} -m multiport --dports {gateway_ports} -j DROP")
    filt += [
        f"-A {chain} -m conntrack --ctdir REPLY -j ACCEPT",
        f"-A {chain} -d {loopback} -j ACCEPT",
        *(f"-A {chain} -d {cidr} -j ACCEPT" for cidr in excluded),
        *(f"-A {chain} -p tcp --dport {port} -j ACCEPT" for port in sorted(plan.exclude_ports)),
        f"-A {chain} -p {icmp} -j ACCEPT",
        f"-A {chain} -j DROP",
    ]
    lines = ["*nat", f":{chain} - [0:0]", *nat, "COMMIT", "*filter", f":{chain} - [0:0]", *filt, "COMMIT"]
    return "\n".join(lines) + "\n"
