"""Identity is the uid: an agent uid cannot borrow another principal through the gateway's own ports.

Each uid is redirected to listener ports of its own, and those ports are how the gateway knows
the principal. Sent straight to loopback, a query or a connection to another uid's port would
get that uid's verdict (names forwarded upstream included); the filter rules drop it instead.
"""

from __future__ import annotations

import sys

import orjson
import pytest

from tests.transparent.netns import AGENT_UID, CODER_UID, DNS_PORT, OTHER_V4, TRANSPARENT_PORT, Topology

UNLISTED_UID = 1002
RESEARCH_DNS, CODER_DNS = DNS_PORT + 1, DNS_PORT + 2  # assign_ports: listed uids in ascending order
RESEARCH_TCP, CODER_TCP = TRANSPARENT_PORT + 1, TRANSPARENT_PORT + 2

# One query straight to a loopback port (no redirect applies to loopback destinations).
DIRECT_QUERY = """
import sys, orjson
from dnslib import DNSRecord, RCODE
name, server, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    raw = DNSRecord.question(name, "A").send(server, port, timeout=2, ipv6=":" in server)
except Exception as exc:
    print(orjson.dumps({"error": exc.__class__.__name__}).decode())
    raise SystemExit(0)
print(orjson.dumps({"rcode": RCODE[DNSRecord.parse(raw).header.rcode]}).decode())
"""
DIRECT_CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
    print("connected")
except OSError as exc:
    print("refused", exc.errno)
"""


def _query(pod: Topology, uid: int, server: str, port: int, name: str = "code.example.net") -> dict[str, str]:
    result = pod.agent(sys.executable, "-c", DIRECT_QUERY, name, server, str(port), uid=uid)
    assert result.returncode == 0, result.stderr
    answer: dict[str, str] = orjson.loads(result.stdout)
    return answer


@pytest.mark.parametrize("server", ["127.0.0.1", "::1"], ids=["v4", "v6"])
def test_a_query_sent_straight_to_another_principals_dns_port_gets_no_answer(pod: Topology, server: str) -> None:
    # code.example.net is coder's name, not research's. The rules drop the datagram as it is sent (EPERM).
    assert _query(pod, AGENT_UID, server, CODER_DNS) == {"error": "PermissionError"}
    assert _query(pod, UNLISTED_UID, server, CODER_DNS) == {"error": "PermissionError"}
    assert _query(pod, UNLISTED_UID, server, RESEARCH_DNS) == {"error": "PermissionError"}
    # The owner reaches its own port (the same port the redirect of port 53 uses).
    assert _query(pod, CODER_UID, server, CODER_DNS) == {"rcode": "NOERROR"}
    assert _query(pod, AGENT_UID, server, RESEARCH_DNS, "docs.example.org") == {"rcode": "NOERROR"}


@pytest.mark.parametrize("server", ["127.0.0.1", "::1"], ids=["v4", "v6"])
def test_a_connection_straight_to_another_principals_transparent_port_is_refused(pod: Topology, server: str) -> None:
    for uid, port in ((AGENT_UID, CODER_TCP), (AGENT_UID, TRANSPARENT_PORT), (UNLISTED_UID, RESEARCH_TCP)):
        result = pod.agent(sys.executable, "-c", DIRECT_CONNECT, server, str(port), uid=uid)
        assert result.stdout.startswith("refused"), (uid, port, result.stdout, result.stderr)
    own = pod.agent(sys.executable, "-c", DIRECT_CONNECT, server, str(CODER_TCP), uid=CODER_UID)
    assert own.stdout == "connected\n", own.stderr


def test_the_tools_api_on_loopback_serves_a_bound_uid_as_its_own_principal(pod: Topology) -> None:
    # No credential at all: before, every uid was `default` here; now the uid decides.
    body = '{"url": "https://docs.example.org/"}'
    for uid, expected in ((AGENT_UID, "research"), (CODER_UID, "coder"), (UNLISTED_UID, "default")):
        step = f"identity-{uid}"
        result = pod.agent(
            "curl", "-sS", "--max-time", "10", "-H", "Content-Type: application/json", "-d", body,
            "-H", f"X-Egress-Step: {step}", "http://127.0.0.1:8080/v1/fetch", uid=uid,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert orjson.loads(result.stdout)["error"]["message"] == f"principal '{expected}' may not use web_fetch"
        lines = pod.wait_audit(lambda line, step=step: line.get("step") == step)
        (line,) = [line for line in lines if line.get("step") == step]
        assert (line["kind"], line["principal"]) == ("fetch", expected)


def test_the_forward_proxy_on_loopback_serves_a_bound_uid_as_its_own_principal(pod: Topology) -> None:
    # code.example.net is coder's only: through the proxy without a credential, coder's uid reaches
    # it and research's uid is refused as research (before, both were `default` and both refused).
    target = "https://code.example.net/"
    resolve = ["--resolve", f"code.example.net:443:{OTHER_V4}"]
    coder = pod.curl("-x", "http://127.0.0.1:3128", target, *resolve, uid=CODER_UID)
    assert coder.returncode == 0, coder.stderr
    assert coder.stdout == f"origin={OTHER_V4} host=code.example.net\n"
    research = pod.curl("-x", "http://127.0.0.1:3128", target, *resolve, uid=AGENT_UID)
    assert "CONNECT tunnel failed, response 403" in research.stderr, research.stderr
    lines = pod.wait_audit(lambda line: line.get("kind") == "connect" and line.get("principal") == "research")
    connects = {
        (line["principal"], line.get("decision"))
        for line in lines
        if line.get("kind") == "connect" and line.get("host") == "code.example.net"
    }
    assert {("coder", "allow"), ("research", "deny")} <= connects
