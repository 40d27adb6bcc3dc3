"""Stale sockets cannot send around the gateway once conntrack has forgotten their connection.

The agent connects to an address and port of its choice; the kernel redirects it to the gateway,
which refuses and closes its side. The agent keeps its sockets. When the pod's conntrack entries
expire (the test shortens the timeouts inside its own namespace, so seconds instead of minutes),
the agent sends data, a FIN or a bare RST on each socket: those segments belong to no tracked
connection, so the nat hook does not redirect them, and rules that accepted all TCP in the filter
hook let them out to the address the agent chose, payload included.

The ground truth is a packet capture on the pod's link (tcpdump in the internet namespace): not
one segment toward the agent's chosen port may appear there, in either family, with either
backend; a control connection through the gateway must appear, so the capture cannot pass empty.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.transparent.conftest import WORLD, transparent_policy
from tests.transparent.netns import ORIGIN_V4, Topology, require_netns

# Addresses the agent picks, off the pod's own subnets so the segments are sent to the next hop (the
# internet namespace, where the capture runs) rather than held for a neighbour that never answers.
CHOSEN_V4 = "198.51.100.77"
CHOSEN_V6 = "2001:db8:77::77"
CHOSEN_PORT = 7777  # not among the policy's ports: the gateway refuses every one of these connections
SOCKETS_PER_FAMILY = 24
CONNTRACK_TIMEOUT_S = 2
CAPTURE_READY_S = 10.0
CAPTURE_SETTLE_S = 0.5
# Every TCP state's timeout, so each connection's entry is gone a few seconds after the gateway closed.
CONNTRACK_SYSCTLS = [
    f"net.netfilter.nf_conntrack_tcp_timeout_{state}={CONNTRACK_TIMEOUT_S}"
    for state in (
        "established",
        "fin_wait",
        "close_wait",
        "last_ack",
        "time_wait",
        "close",
        "syn_sent",
        "syn_recv",
        "unacknowledged",
        "max_retrans",
    )
] + [
    # Without mid-stream pickup the agent's data segment is invalid too, as the issue saw it (with
    # pickup it is redirected to the gateway's listener, which resets it): the worst case is tested.
    "net.netfilter.nf_conntrack_tcp_loose=0"
]

# The agent: many sockets in parallel, each refused and closed by the gateway; once their conntrack
# entries are gone, a third send data, a third a bare FIN, a third a bare RST (linger 0).
STALE_SOCKETS_AGENT = f"""
import socket, struct, sys, time
targets = [(socket.AF_INET, "{CHOSEN_V4}"), (socket.AF_INET6, "{CHOSEN_V6}")]
sockets = []
for family, address in targets:
    for _ in range({SOCKETS_PER_FAMILY}):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect((address, {CHOSEN_PORT}))
        s.sendall(b"\\x00\\x01 not TLS, not HTTP")
        sockets.append(s)
closed = 0
for s in sockets:
    try:
        while s.recv(4096):
            pass
        closed += 1
    except OSError:
        pass
time.sleep({CONNTRACK_TIMEOUT_S} * 3)
sent = 0
for index, s in enumerate(sockets):
    try:
        if index % 3 == 0:
            s.send(b"LEAKED-PAYLOAD")
        elif index % 3 == 1:
            s.shutdown(socket.SHUT_WR)
        else:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sent += 1
    except OSError:
        pass
time.sleep(1.0)
for s in sockets:
    s.close()
print(closed, sent)
"""


class Capture:
    """tcpdump on the internet side of the pod's veth, written to a file read back after stopping."""

    def __init__(self, pod: Topology, expression: str) -> None:
        self.path = pod.dir / "link.pcap"
        self.stderr = pod.dir / "tcpdump.log"
        with self.stderr.open("wb") as stderr:
            tcpdump = ["tcpdump", "-Z", "root", "-i", pod.veth_inet, "-n", "--immediate-mode", "-U"]
            self.process = subprocess.Popen(
                ["ip", "netns", "exec", pod.inet, *tcpdump, "-w", str(self.path), *expression.split()],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        deadline = time.monotonic() + CAPTURE_READY_S
        while "listening on" not in self.stderr.read_text(errors="replace"):
            assert self.process.poll() is None, self.stderr.read_text(errors="replace")
            assert time.monotonic() < deadline, "tcpdump did not start"
            time.sleep(0.05)

    def stop(self) -> list[str]:
        """The captured packets, one tcpdump line each."""
        time.sleep(CAPTURE_SETTLE_S)  # the last segments are still in flight on the link
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        read = subprocess.run(
            ["tcpdump", "-r", str(self.path), "-n", "-tt"], capture_output=True, text=True, timeout=30, check=False
        )
        return [line for line in read.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def leaky_pod() -> Iterator[Topology]:
    require_netns()
    if subprocess.run(["which", "tcpdump"], capture_output=True, check=False).returncode != 0:
        pytest.fail("tcpdump is not installed (scripts/install-system-deps.sh installs it)")
    topology = Topology("leak")
    try:
        topology.build()
        for setting in CONNTRACK_SYSCTLS:
            # Per network namespace on this kernel: the host's own timeouts are untouched.
            subprocess.run(["ip", "netns", "exec", topology.pod, "sysctl", "-qw", setting], check=True, timeout=30)
        topology.start_world(WORLD)
        topology.start_gateway(transparent_policy())
        yield topology
    finally:
        topology.destroy()


@pytest.fixture(params=["nftables", "iptables"])
def backend(request: pytest.FixtureRequest, leaky_pod: Topology) -> Iterator[str]:
    name: str = request.param
    leaky_pod.redirect("--apply", "--backend", name)
    try:
        yield name
    finally:
        leaky_pod.redirect("--remove", "--backend", name, check=False)


def _conntrack_sysctl(pod: Topology) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", pod.pod, "sysctl", "-n", "net.netfilter.nf_conntrack_tcp_timeout_close_wait"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()


def test_stale_sockets_send_nothing_past_the_gateway_after_conntrack_forgets_them(
    leaky_pod: Topology, backend: str
) -> None:
    assert _conntrack_sysctl(leaky_pod) == str(CONNTRACK_TIMEOUT_S)
    capture = Capture(leaky_pod, f"tcp port {CHOSEN_PORT} or tcp port 443")
    packets: list[str] = []
    try:
        agent = leaky_pod.agent(sys.executable, "-c", STALE_SOCKETS_AGENT)
        assert agent.returncode == 0, agent.stderr
        closed, sent = (int(n) for n in agent.stdout.split())
        # Every connection reached the gateway and was closed by it; every socket then sent something.
        assert closed == sent == 2 * SOCKETS_PER_FAMILY, agent.stdout
        # The control: an allowed request crosses the same link through the gateway.
        control = leaky_pod.curl("https://docs.example.org/", "--resolve", f"docs.example.org:443:{ORIGIN_V4}")
        assert control.returncode == 0, control.stderr
    finally:
        with contextlib.suppress(OSError):
            packets = capture.stop()
    leaked = [line for line in packets if f".{CHOSEN_PORT}:" in line]
    payload = [line for line in leaked if not line.endswith("length 0")]
    resets = [line for line in leaked if "Flags [R" in line]
    assert not leaked, (
        f"{backend}: {len(leaked)} segments left the pod around the gateway ({len(payload)} with payload, "
        f"{len(resets)} resets):\n" + "\n".join(leaked[:10])
    )
    assert any(".443:" in line for line in packets), "the capture saw nothing at all: it proves nothing"


def test_conntrack_timeouts_were_shortened_in_the_pod_only(leaky_pod: Topology) -> None:
    host = Path("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait")
    assert _conntrack_sysctl(leaky_pod) == str(CONNTRACK_TIMEOUT_S)
    if host.exists():
        assert host.read_text().strip() != str(CONNTRACK_TIMEOUT_S)
