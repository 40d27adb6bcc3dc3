"""The interception rules as rendered text, and the policy's `transparent:` section."""

from __future__ import annotations

import pytest

from gateway.policy.load import PolicyError, parse_policy
from gateway.redirect.rules import RedirectPlan, render_iptables, render_nft
from gateway.transparent.ports import PortAssignment, assign_ports

PLAN = RedirectPlan(
    gateway_uid=15337,
    tcp_ports=assign_ports(15001, [1001, 1000]),
    dns_ports=assign_ports(15053, [1001, 1000]),
    exclude_cidrs=("10.96.0.1/32", "fd00::/8"),
    exclude_ports=(6443,),
)


def test_ports_are_assigned_in_uid_order_above_the_base_port() -> None:
    assert assign_ports(15001, [1001, 1000]) == (
        PortAssignment(15001, None),
        PortAssignment(15002, 1000),
        PortAssignment(15003, 1001),
    )


def test_nft_rules_exempt_the_gateway_first_and_send_listed_uids_to_their_ports() -> None:
    text = render_nft(PLAN)
    rules = [line.strip() for line in text.splitlines()]
    nat = rules[rules.index("chain nat_output {") + 2 :]
    assert nat[0] == "meta skuid 15337 return"
    assert nat.index("meta skuid 1000 meta l4proto tcp redirect to :15002") < nat.index(
        "meta l4proto tcp redirect to :15001"
    )
    assert "meta skuid 1001 meta l4proto { tcp, udp } th dport 53 redirect to :15055" in rules
    assert "ip daddr { 10.96.0.1/32 } return" in rules
    assert "ip6 daddr { fd00::/8 } return" in rules
    assert "tcp dport { 6443 } return" in rules
    assert rules[-3] == "counter drop"
    # Idempotent as one transaction: declare, delete, define.
    assert text.startswith("table inet egress_gateway {}\ndelete table inet egress_gateway\n")


def test_nft_filter_drops_invalid_first_and_accepts_no_tcp_it_did_not_redirect_or_exclude() -> None:
    rules = [line.strip() for line in render_nft(PLAN).splitlines()]
    filt = rules[rules.index("chain filter_output {") + 2 : -2]
    assert filt[:2] == ["meta skuid 15337 accept", "ct state invalid counter drop"]
    assert "tcp dport { 6443 } accept" in filt
    assert not [rule for rule in filt if "l4proto { tcp" in rule and rule.endswith("accept") and "dport" not in rule]
    assert filt[-2:] == ["meta l4proto { icmp, ipv6-icmp } accept", "counter drop"]


def test_each_uid_reaches_only_its_own_gateway_ports() -> None:
    rules = [line.strip() for line in render_nft(PLAN).splitlines()]
    own = "meta skuid 1000 ip daddr 127.0.0.0/8 meta l4proto { tcp, udp } th dport { 15002, 15054 } accept"
    others = "meta skuid 1000 ip daddr 127.0.0.0/8 meta l4proto { tcp, udp } th dport { 15001-15003, 15053-15055 } drop"
    catch_all = "ip6 daddr ::1/128 meta l4proto { tcp, udp } th dport { 15001, 15053 } accept"
    assert rules.index(own) + 1 == rules.index(others)
    # Every listed uid is decided before the catch-all, which would hand it the base (default) ports.
    assert rules.index(others) < rules.index(catch_all)


@pytest.mark.parametrize(("version", "loopback", "icmp"), [(4, "127.0.0.0/8", "icmp"), (6, "::1/128", "ipv6-icmp")])
def test_iptables_rendering_per_family(version: int, loopback: str, icmp: str) -> None:
    text = render_iptables(PLAN, version)
    assert f"-A EGRESS_GW_OUTPUT -d {loopback} -j RETURN" in text
    assert f"-A EGRESS_GW_OUTPUT -p {icmp} -j ACCEPT" in text
    assert "-A EGRESS_GW_OUTPUT -m conntrack --ctstate INVALID -j DROP" in text
    assert "-A EGRESS_GW_OUTPUT -p tcp -j ACCEPT" not in text
    assert (
        f"-A EGRESS_GW_OUTPUT -m owner --uid-owner 1001 -d {loopback} -p udp -m multiport "
        "--dports 15001:15003,15053:15055 -j DROP"
    ) in text
    assert ("10.96.0.1/32" in text) == (version == 4)
    assert text.count("COMMIT") == 2


BASE = """version: 1
principals:
  default: {egress: {allow_domains: ['*']}}
  coder: {egress: {allow_domains: [example.org]}}
"""


def test_transparent_section_parses() -> None:
    policy = parse_policy(
        BASE
        + """transparent:
  principals: {1001: coder}
  destination: strict
  raw_tcp: ['git.example.org:22', '192.0.2.7:5432']
  dns: {denied_answer: refused, allow_types: [a, AAAA, MX]}
"""
    )
    settings = policy.transparent
    assert settings.principal_for_uid(1001) == "coder"
    assert settings.principal_for_uid(1002) == "default"
    assert settings.destination == "strict"
    assert [(r.host, r.port) for r in settings.raw_tcp] == [("git.example.org", 22), ("192.0.2.7", 5432)]
    assert settings.dns_denied_answer == "refused"
    assert settings.dns_allow_types == ("A", "AAAA", "MX")


@pytest.mark.parametrize(
    ("section", "message"),
    [
        pytest.param("principals: {1001: nobody}", "names no principal 'nobody'", id="unknown-principal"),
        pytest.param("destination: loose", "must be one of follow-name, strict", id="bad-destination"),
        pytest.param("raw_tcp: ['git.example.org']", "is not host:port", id="raw-without-port"),
        pytest.param("dns: {allow_types: [BOGUS]}", "unknown query type 'BOGUS'", id="bad-qtype"),
        pytest.param("dns: {denied_answer: drop}", "must be one of nxdomain, refused", id="bad-denied-answer"),
        pytest.param("listen: 15001", "unknown key 'listen'", id="unknown-key"),
    ],
)
def test_invalid_transparent_sections_name_the_line(section: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(BASE + "transparent:\n  " + section + "\n", "p.yaml")
    assert any(message in error and error.startswith("p.yaml:6:") for error in caught.value.errors), caught.value.errors
