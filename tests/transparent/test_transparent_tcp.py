"""Redirected TCP in a real pod namespace: the agent uses no proxy settings and still goes through
the gateway, which decides on the name the connection itself carries."""

from __future__ import annotations

import re
import signal
import sys
import time

from tests.transparent.conftest import SILENT_V4, transparent_policy
from tests.transparent.netns import CODER_UID, GATEWAY_UID, ORIGIN_V4, ORIGIN_V6, OTHER_V4, POD_V4, Topology, line_time

RAW_CLIENT = (
    "import socket,sys\n"
    "s=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
    "s.sendall(b'SSH-2.0-agent\\r\\n')\n"
    "print(repr(s.recv(100)))\n"
)
# Two requests on one kept-alive connection, each with its own Host: each is decided on its own.
KEEP_ALIVE_CLIENT = (
    "import socket,sys\n"
    "s=socket.create_connection((sys.argv[1], 80), timeout=5)\n"
    "f=s.makefile('rb')\n"
    "for host in sys.argv[2:]:\n"
    "    s.sendall(b'GET /k HTTP/1.1\\r\\nHost: ' + host.encode() + b'\\r\\n\\r\\n')\n"
    "    status=f.readline().split()[1].decode(); length=0; code=''\n"
    "    while (line := f.readline()) not in (b'\\r\\n', b''):\n"
    "        name, _, value = line.decode().partition(':')\n"
    "        if name.lower() == 'content-length': length = int(value)\n"
    "        if name.lower() == 'x-egress-code': code = value.strip()\n"
    "    body=f.read(length).decode()\n"
    "    print(status, code, body.strip())\n"
)
# One TLS connection held open across a policy reload: a request, a pause (stdin), another request.
HELD_TLS_CLIENT = (
    "import socket,ssl,sys\n"
    "ctx=ssl.create_default_context(cafile=sys.argv[1])\n"
    "s=ctx.wrap_socket(socket.create_connection((sys.argv[2], 443), timeout=10), server_hostname=sys.argv[3])\n"
    "req=b'GET / HTTP/1.1\\r\\nHost: ' + sys.argv[3].encode() + b'\\r\\n\\r\\n'\n"
    "s.sendall(req); print(s.recv(4096).split(b'\\r\\n')[0].decode(), flush=True)\n"
    "sys.stdin.readline()\n"
    "try:\n"
    "    s.sendall(req); data=s.recv(4096)\n"
    "    print('second', data.split(b'\\r\\n')[0].decode() if data else 'closed', flush=True)\n"
    "except (OSError, ssl.SSLError) as exc:\n"
    "    print('second closed', type(exc).__name__, flush=True)\n"
)
UDP_CLIENT = (
    "import socket,sys\n"
    "s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "try:\n"
    "    s.sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))\n"
    "    print('sent')\n"
    "except OSError as exc:\n"
    "    print('refused', exc)\n"
)


def _transparent(lines: list[dict[str, object]], event: str = "decision") -> list[dict[str, object]]:
    return [line for line in lines if line.get("kind") == "transparent" and line.get("event") == event]


def test_curl_https_without_proxy_settings_is_forced_through_the_gateway(pod: Topology) -> None:
    result = pod.curl("https://docs.example.org/", "--resolve", f"docs.example.org:443:{ORIGIN_V4}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"origin={ORIGIN_V4} host=docs.example.org\n"
    lines = pod.wait_audit(lambda line: line.get("kind") == "transparent" and line.get("event") == "close")
    allowed = [d for d in _transparent(lines) if d["decision"] == "allow" and d.get("host") == "docs.example.org"]
    assert allowed, lines
    assert allowed[-1]["principal"] == "research"
    assert allowed[-1]["original_dst"] == f"{ORIGIN_V4}:443"
    assert (allowed[-1]["rule"], allowed[-1]["rule_pattern"]) == ("allow_domains[0]", "docs.example.org")
    # The decision and close lines of one connection share its id and name the client.
    conn = allowed[-1]["conn"]
    lines = pod.wait_audit(lambda line: line.get("conn") == conn and line.get("event") == "close")
    (close,) = [line for line in _transparent(lines, "close") if line.get("conn") == conn]
    assert close["client_ip"] == allowed[-1]["client_ip"]
    assert isinstance(close["client_port"], int)
    assert close["address"] == ORIGIN_V4


def test_curl_http_without_proxy_settings_is_forwarded_per_request(pod: Topology) -> None:
    result = pod.curl("http://docs.example.org/page", "--resolve", f"docs.example.org:80:{ORIGIN_V4}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"origin={ORIGIN_V4} host=docs.example.org\n"
    lines = pod.wait_audit(lambda line: line.get("kind") == "transparent" and line.get("method") == "GET")
    allowed = [d for d in _transparent(lines) if d.get("method") == "GET" and d.get("port") == 80]
    assert allowed
    assert allowed[-1]["principal"] == "research"
    assert allowed[-1]["host"] == "docs.example.org"
    assert allowed[-1]["rule"] == "allow_domains[0]"


def test_each_request_on_a_kept_alive_connection_is_decided_on_its_own_host(pod: Topology) -> None:
    result = pod.agent(sys.executable, "-c", KEEP_ALIVE_CLIENT, ORIGIN_V4, "docs.example.org", "code.example.net")
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first == f"200  origin={ORIGIN_V4} host=docs.example.org"
    assert second.startswith("403 policy_denied ")


def test_plain_http_with_a_proxy_credential_still_gets_the_uids_principal(pod: Topology) -> None:
    result = pod.curl(
        "http://code.example.net/",
        "--resolve",
        f"code.example.net:80:{ORIGIN_V4}",
        "-H",
        "Proxy-Authorization: Basic Y29kZXI6eA==",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
    )
    assert result.stdout == "403"


def test_a_connection_made_straight_to_a_transparent_port_is_refused(pod: Topology) -> None:
    # Loopback is never redirected, so this reaches the listener with no original destination.
    result = pod.agent(sys.executable, "-c", RAW_CLIENT, "127.0.0.1", "15002")
    assert "SSH" not in result.stdout
    lines = pod.wait_audit(lambda line: "not a redirected connection" in str(line.get("reason")))
    assert [d for d in _transparent(lines) if "not a redirected connection" in str(d.get("reason"))]


def test_denied_name_is_refused_for_that_uid(pod: Topology) -> None:
    result = pod.curl("https://code.example.net/", "--resolve", f"code.example.net:443:{OTHER_V4}")
    assert result.returncode != 0
    lines = pod.wait_audit(lambda line: line.get("host") == "code.example.net" and line.get("decision") == "deny")
    denied = [d for d in _transparent(lines) if d.get("host") == "code.example.net" and d["decision"] == "deny"]
    assert denied
    assert denied[-1]["principal"] == "research"
    assert denied[-1]["code"] == "policy_denied"
    assert denied[-1]["rule"] == "default_deny"


def test_verdict_counts_use_the_audit_vocabulary_when_a_dial_fails(pod: Topology) -> None:
    # TLS to an allowed name on a port where nothing listens: the policy allowed it, the dial failed.
    result = pod.curl("https://code.example.net:80/", "--resolve", f"code.example.net:80:{OTHER_V4}", uid=CODER_UID)
    assert result.returncode != 0
    lines = pod.wait_audit(lambda line: line.get("port") == 80 and line.get("close_reason") == "connect_failure")
    (close,) = [c for c in _transparent(lines, "close") if c.get("port") == 80 and c.get("host") == "code.example.net"]
    assert close["close_reason"] == "connect_failure"
    counted = re.findall(r"^egress_gateway_decisions_total\{([^}]*)\}", pod.metrics(), re.MULTILINE)
    verdicts = {re.search(r'decision="([^"]*)"', labels)[1] for labels in counted if 'kind="transparent"' in labels}  # type: ignore[index]
    assert "allow" in verdicts
    assert verdicts <= {"allow", "deny", "would_deny", "none"}


def test_two_uids_get_their_own_principals(pod: Topology) -> None:
    result = pod.curl("https://code.example.net/", "--resolve", f"code.example.net:443:{OTHER_V4}", uid=CODER_UID)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"origin={OTHER_V4} host=code.example.net\n"
    refused = pod.curl("https://docs.example.org/", "--resolve", f"docs.example.org:443:{ORIGIN_V4}", uid=CODER_UID)
    assert refused.returncode != 0
    lines = pod.wait_audit(lambda line: line.get("principal") == "coder" and line.get("decision") == "deny")
    coder = [d for d in _transparent(lines) if d.get("principal") == "coder"]
    assert {(d.get("host"), d["decision"]) for d in coder} >= {
        ("code.example.net", "allow"),
        ("docs.example.org", "deny"),
    }


def test_raw_tcp_to_a_non_http_port_is_refused_and_never_reaches_the_server(pod: Topology) -> None:
    result = pod.agent(sys.executable, "-c", RAW_CLIENT, ORIGIN_V4, "22")
    assert "SSH-2.0-world" not in result.stdout
    lines = pod.wait_audit(lambda line: line.get("code") == "protocol_unknown")
    denied = [d for d in _transparent(lines) if d.get("code") == "protocol_unknown"]
    assert denied
    assert str(denied[-1]["seen"]).startswith("SSH-2.0-agent")
    assert denied[-1]["original_dst"] == f"{ORIGIN_V4}:22"
    assert pod.world_log("raw.log") == ""


def test_a_dns_lie_pointing_at_the_metadata_address_reaches_only_the_named_host(pod: Topology) -> None:
    # The agent's own resolver says the metadata address; the gateway resolves the name itself.
    result = pod.curl("https://docs.example.org/", "--resolve", "docs.example.org:443:169.254.169.254")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"origin={ORIGIN_V4} host=docs.example.org\n"
    lines = pod.wait_audit(lambda line: line.get("original_dst") == "169.254.169.254:443")
    assert [d for d in _transparent(lines) if d.get("original_dst") == "169.254.169.254:443"][-1]["decision"] == "allow"


def test_the_metadata_address_without_a_name_is_refused(pod: Topology) -> None:
    result = pod.curl("-k", "https://169.254.169.254/latest/meta-data/")
    assert result.returncode != 0
    lines = pod.wait_audit(
        lambda line: line.get("original_dst") == "169.254.169.254:443" and "SNI" in line.get("reason", "")
    )
    assert any(d["decision"] == "deny" for d in _transparent(lines) if "SNI" in str(d.get("reason")))


def test_sni_of_an_allowed_host_sent_to_another_address_reaches_only_the_allowed_host(pod: Topology) -> None:
    result = pod.curl("https://docs.example.org/", "--resolve", f"docs.example.org:443:{OTHER_V4}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"origin={ORIGIN_V4} host=docs.example.org\n"


def test_ipv6_connections_are_intercepted_the_same_way(pod: Topology) -> None:
    result = pod.curl("-6", "https://docs.example.org/", "--resolve", f"docs.example.org:443:[{ORIGIN_V6}]")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("origin=")
    lines = pod.wait_audit(lambda line: line.get("original_dst") == f"[{ORIGIN_V6}]:443")
    assert [d for d in _transparent(lines) if d.get("original_dst") == f"[{ORIGIN_V6}]:443"][-1]["decision"] == "allow"
    denied = pod.curl("-6", "https://code.example.net/", "--resolve", f"code.example.net:443:[{ORIGIN_V6}]")
    assert denied.returncode != 0


def test_the_gateways_own_traffic_is_not_looped(pod: Topology) -> None:
    started = time.time()
    result = pod.curl("https://docs.example.org/", "--resolve", f"docs.example.org:443:{ORIGIN_V4}", uid=GATEWAY_UID)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"origin={ORIGIN_V4} host=docs.example.org\n"
    # A marker from the agent afterwards: the log is written in order, so once the marker's line
    # is there, a line for the gateway's own connection (decided before it) would be there too.
    # Its name is used nowhere else, so its denial is never folded into an earlier one's count.
    marker = "loop-marker.example.net"
    assert pod.curl(f"https://{marker}/", "--resolve", f"{marker}:443:{OTHER_V4}").returncode != 0
    lines = pod.wait_audit(lambda line: line.get("host") == marker)
    since = [line for line in _transparent(lines) if line_time(line) >= started]
    assert [line.get("host") for line in since] == [marker], since


def test_udp_other_than_dns_cannot_leave_the_pod(pod: Topology) -> None:
    agent = pod.agent(sys.executable, "-c", UDP_CLIENT, ORIGIN_V4, "9999", "from-agent")
    gateway = pod.agent(sys.executable, "-c", UDP_CLIENT, ORIGIN_V4, "9999", "from-gateway", uid=GATEWAY_UID)
    assert "sent" in gateway.stdout
    deadline = time.monotonic() + 5
    while "from-gateway" not in pod.world_log("udp.log") and time.monotonic() < deadline:
        time.sleep(0.02)
    log = pod.world_log("udp.log")
    assert "from-gateway" in log  # the sink works, so the agent's datagram was really dropped
    assert "from-agent" not in log
    assert agent.returncode == 0


def test_a_raw_tcp_exception_reaches_exactly_that_address(pod: Topology) -> None:
    assert pod.gateway is not None
    pod.write_policy(transparent_policy(raw_tcp=[f"{ORIGIN_V4}:22"]))
    pod.gateway.send_signal(signal.SIGHUP)
    try:
        deadline = time.monotonic() + 10
        result = pod.agent(sys.executable, "-c", RAW_CLIENT, ORIGIN_V4, "22")
        while "SSH-2.0-world" not in result.stdout and time.monotonic() < deadline:
            time.sleep(0.1)  # the reload is asynchronous to the signal
            result = pod.agent(sys.executable, "-c", RAW_CLIENT, ORIGIN_V4, "22")
        assert "SSH-2.0-world" in result.stdout, result.stderr
        assert pod.world_log("raw.log").strip() == POD_V4  # the gateway dialed it, from the pod
        lines = pod.wait_audit(
            lambda line: (
                line.get("kind") == "transparent" and line.get("port") == 22 and line.get("decision") == "allow"
            )
        )
        allowed = [d for d in _transparent(lines) if d.get("port") == 22 and d["decision"] == "allow"]
        assert allowed
        assert allowed[-1]["original_dst"] == f"{ORIGIN_V4}:22"
        # Another address on the same port is still not an exception.
        other = pod.agent(sys.executable, "-c", RAW_CLIENT, OTHER_V4, "22")
        assert "SSH-2.0-world" not in other.stdout
    finally:
        pod.write_policy(transparent_policy())
        pod.gateway.send_signal(signal.SIGHUP)


def test_an_excluded_cidr_and_port_are_left_alone_and_the_hole_closes_again(pod: Topology) -> None:
    # The policy allows no raw TCP, so a banner reaching the agent proves the rules let it pass.
    assert "SSH-2.0-world" not in pod.agent(sys.executable, "-c", RAW_CLIENT, ORIGIN_V4, "22").stdout
    try:
        for exclusion in (["--exclude-ports", "22"], ["--exclude-cidrs", f"{ORIGIN_V4}/32"]):
            pod.redirect("--apply", *exclusion)
            result = pod.agent(sys.executable, "-c", RAW_CLIENT, ORIGIN_V4, "22")
            assert "SSH-2.0-world" in result.stdout, (exclusion, result.stderr)
            # Only the excluded destination: another address on port 443 is still intercepted.
            denied = pod.agent("curl", "-sS", "-o", "/dev/null", "--max-time", "5", "--resolve",
                               f"blocked.example.net:443:{OTHER_V4}", "https://blocked.example.net/")  # fmt: skip
            assert denied.returncode != 0
    finally:
        pod.redirect("--apply")
    assert "SSH-2.0-world" not in pod.agent(sys.executable, "-c", RAW_CLIENT, ORIGIN_V4, "22").stdout


def test_a_reload_that_denies_an_open_tunnel_closes_it(pod: Topology) -> None:
    assert pod.gateway is not None
    ca = str(pod.gateway_dir / "test-ca.pem")
    agent = pod.agent_process(sys.executable, "-c", HELD_TLS_CLIENT, ca, ORIGIN_V4, "docs.example.org")
    try:
        assert agent.stdout is not None
        assert agent.stdin is not None
        assert agent.stdout.readline().startswith("HTTP/1.1 200")
        narrowed = transparent_policy()
        narrowed["principals"]["research"]["egress"]["allow_domains"] = ["private.example.org"]
        pod.write_policy(narrowed)
        pod.gateway.send_signal(signal.SIGHUP)
        lines = pod.wait_audit(lambda line: line.get("close_reason") == "policy_changed", timeout_s=10)
        closed = [line for line in lines if line.get("close_reason") == "policy_changed"]
        assert closed, "the reload did not close the tunnel"
        assert closed[-1]["kind"] == "transparent"
        assert closed[-1]["host"] == "docs.example.org"
        agent.stdin.write("\n")
        agent.stdin.flush()
        assert agent.stdout.readline().startswith("second closed")
    finally:
        agent.kill()
        agent.communicate(timeout=10)
        pod.write_policy(transparent_policy())
        pod.gateway.send_signal(signal.SIGHUP)


def test_a_dial_that_gets_no_answer_ends_at_the_connect_timeout_with_its_lines(pod: Topology) -> None:
    # The name's one address drops every SYN: only the connection's own wheel entry (the
    # attempt's dial deadline) ends the dial, long before the kernel would give up (~2 min).
    assert pod.gateway is not None
    policy = transparent_policy()
    policy["defaults"]["allow_cidrs"].append(f"{SILENT_V4}/32")
    policy["proxy"] = {"connect_timeout_s": 0.3}
    policy["principals"]["research"]["egress"]["allow_domains"].append("silent.example.org")
    pod.write_policy(policy)
    pod.gateway.send_signal(signal.SIGHUP)
    try:
        deadline = time.monotonic() + 15
        closes: list[dict[str, object]] = []
        while not closes and time.monotonic() < deadline:  # the reload is asynchronous to the signal
            url, pinned = "https://silent.example.org/", f"silent.example.org:443:{ORIGIN_V4}"
            pod.curl(url, "--resolve", pinned, "--max-time", "3")
            lines = pod.wait_audit(lambda line: line.get("host") == "silent.example.org" and "close_reason" in line)
            closes = [c for c in _transparent(lines, "close") if c.get("host") == "silent.example.org"]
        assert closes, "the dial to an address that never answers did not end"
        assert closes[-1]["close_reason"] == "connect_failure"
        assert closes[-1]["bytes_up"] == 0
        allowed = [d for d in _transparent(lines) if d.get("host") == "silent.example.org" and d["decision"] == "allow"]
        assert allowed[-1]["addresses"] == [SILENT_V4]
        assert allowed[-1]["original_dst"] == f"{ORIGIN_V4}:443"
    finally:
        pod.write_policy(transparent_policy())
        pod.gateway.send_signal(signal.SIGHUP)


def test_strict_destination_refuses_an_address_that_is_not_the_names(pod: Topology) -> None:
    assert pod.gateway is not None
    pod.write_policy(transparent_policy("strict"))
    pod.gateway.send_signal(signal.SIGHUP)
    try:
        deadline = time.monotonic() + 10
        mismatch: list[dict[str, object]] = []
        while not mismatch and time.monotonic() < deadline:
            result = pod.curl("https://docs.example.org/", "--resolve", f"docs.example.org:443:{OTHER_V4}")
            lines = pod.wait_audit(lambda line: line.get("code") == "destination_mismatch", timeout_s=0.3)
            mismatch = [d for d in _transparent(lines) if d.get("code") == "destination_mismatch"]
        assert mismatch, "strict mode never refused the mismatched address"
        assert result.returncode != 0
        assert mismatch[-1]["original_dst"] == f"{OTHER_V4}:443"
        # The name's own address still passes under strict.
        ok = pod.curl("https://docs.example.org/", "--resolve", f"docs.example.org:443:{ORIGIN_V4}")
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout == f"origin={ORIGIN_V4} host=docs.example.org\n"
    finally:
        pod.write_policy(transparent_policy())
        pod.gateway.send_signal(signal.SIGHUP)


def test_every_audit_line_matches_the_schema(pod: Topology) -> None:
    assert pod.audit()
    assert pod.schema_errors() == []


def test_plain_http_audit_lines_name_the_address_the_agent_dialled(pod: Topology) -> None:
    # The metadata address dialled with an allowed Host: the request goes to the name's own
    # address, and every line says where the agent was aiming.
    result = pod.curl("http://docs.example.org/meta", "--resolve", "docs.example.org:80:169.254.169.254")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"origin={ORIGIN_V4} host=docs.example.org\n"
    lines = pod.wait_audit(
        lambda line: line.get("kind") == "transparent" and line.get("event") == "close" and line.get("path") == "/meta"
    )
    mine = [line for line in lines if line.get("kind") == "transparent" and line.get("path") == "/meta"]
    assert {line["event"] for line in mine} == {"decision", "close"}
    assert all(line.get("original_dst") == "169.254.169.254:80" for line in mine), mine
    assert pod.schema_errors() == []
