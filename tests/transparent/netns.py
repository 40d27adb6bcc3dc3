"""An "agent pod" and an "internet" network namespace joined by a veth pair, made and removed by tests.

The pod holds the gateway (under its own uid, exempt from the rules), the rules applied by the
real `egress-gateway redirect --apply`, and agent processes under other uids (`setpriv`). The
internet namespace holds origins, a banner TCP server, a UDP sink and the upstream DNS on
documentation addresses that the policy allows by exception. The pod's only route leads into the
internet namespace, which has no route at all: nothing can leave the machine.

Where the kernel or the user cannot make namespaces, `require_netns` skips with the reason, or
fails when NETNS_TESTS_REQUIRED=1 (set by .ci/run: CI has root and must run these tests).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.harness.audit_file import audit_records
from tests.harness.audit_schema import note_file

REPO = Path(__file__).resolve().parents[2]
ETC_NETNS = Path("/etc/netns")
GATEWAY_UID = 15337
AGENT_UID = 1000
CODER_UID = 1001
POD_V4, INET_V4 = "203.0.113.1", "203.0.113.2"
POD_V6, INET_V6 = "2001:db8::1", "2001:db8::2"
ORIGIN_V4 = "203.0.113.10"
OTHER_V4 = "203.0.113.11"
PRIVATE_V4 = "10.20.30.40"
ORIGIN_V6 = "2001:db8::10"
DNS_V4 = "203.0.113.53"
TRANSPARENT_PORT = 15001
DNS_PORT = 15053
READY_TIMEOUT_S = 20.0
COMMAND_TIMEOUT_S = 30.0


DIG = """
import sys, orjson
from dnslib import DNSRecord, EDNS0, RCODE
name, qtype, server, mode = sys.argv[1:5]
query = DNSRecord.question(name, qtype)
if mode == "edns":
    query.add_ar(EDNS0(udp_len=4096))
try:
    raw = query.send(server, 53, tcp=mode == "tcp", timeout=5, ipv6=":" in server)
except Exception as exc:
    print(orjson.dumps({"error": exc.__class__.__name__}).decode())
    raise SystemExit(0)
reply = DNSRecord.parse(raw)
print(orjson.dumps({"rcode": RCODE[reply.header.rcode], "tc": reply.header.tc,
                    "answers": sorted(str(rr.rdata) for rr in reply.rr)}).decode())
"""


def line_time(line: Mapping[str, Any]) -> float:
    """An audit line's `time` (RFC 3339 UTC) as Unix time."""
    return datetime.fromisoformat(str(line["time"]).replace("Z", "+00:00")).timestamp()


def _run(argv: Sequence[str], *, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=check, **kwargs)


def require_netns() -> None:
    """Skip (or fail in CI) with the reason when this machine cannot build the topology."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append("network namespaces need root")
    for tool in ("ip", "nft", "setpriv", "curl"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is not installed (scripts/install-system-deps.sh)")
    if not problems:
        probe = _run(["unshare", "-n", "nft", "list", "ruleset"], check=False)
        if probe.returncode != 0:
            problems.append(f"the kernel refused a network namespace with nftables: {probe.stderr.strip()}")
    if problems:
        reason = "; ".join(problems)
        if os.environ.get("NETNS_TESTS_REQUIRED") == "1":
            pytest.fail(f"netns tests must run here (NETNS_TESTS_REQUIRED=1) but cannot: {reason}")
        pytest.skip(reason)


class Topology:
    """Both namespaces, the world process, and the gateway started in the pod."""

    def __init__(self, tag: str) -> None:
        suffix = f"{os.getpid()}-{tag}"
        self.pod = f"egt-pod-{suffix}"
        self.inet = f"egt-inet-{suffix}"
        self.dir = Path(tempfile.mkdtemp(prefix=f"egt-{tag}-"))
        self.dir.chmod(0o755)
        self.world: subprocess.Popen[bytes] | None = None
        self.gateway: subprocess.Popen[bytes] | None = None
        self.gateway_dir = self.dir / "gateway"
        self.world_dir = self.dir / "world"
        self.etc_netns_existed = True
        self.veth_pod, self.veth_inet = f"egtp{os.getpid() % 100000}{tag[:2]}", f"egti{os.getpid() % 100000}{tag[:2]}"

    # building ---------------------------------------------------------------------------------
    def build(self) -> Topology:
        pod, inet = self.pod, self.inet
        veth_pod, veth_inet = self.veth_pod, self.veth_inet
        commands = [
            ["ip", "netns", "add", pod],
            ["ip", "netns", "add", inet],
            ["ip", "link", "add", veth_pod, "type", "veth", "peer", "name", veth_inet],
            ["ip", "link", "set", veth_pod, "netns", pod],
            ["ip", "link", "set", veth_inet, "netns", inet],
        ]
        for ns, dev, v4, v6 in ((pod, veth_pod, POD_V4, POD_V6), (inet, veth_inet, INET_V4, INET_V6)):
            commands += [
                ["ip", "-n", ns, "link", "set", "lo", "up"],
                ["ip", "-n", ns, "addr", "add", f"{v4}/24", "dev", dev],
                ["ip", "-n", ns, "-6", "addr", "add", f"{v6}/64", "dev", dev, "nodad"],
                ["ip", "-n", ns, "link", "set", dev, "up"],
            ]
        for extra in (ORIGIN_V4, OTHER_V4, DNS_V4):
            commands.append(["ip", "-n", inet, "addr", "add", f"{extra}/32", "dev", veth_inet])
        commands += [
            ["ip", "-n", inet, "-6", "addr", "add", f"{ORIGIN_V6}/128", "dev", veth_inet, "nodad"],
            ["ip", "-n", inet, "addr", "add", f"{PRIVATE_V4}/32", "dev", veth_inet],
            # Every destination the pod dials is routed into the internet namespace, and no further.
            ["ip", "-n", pod, "route", "add", "default", "via", INET_V4],
            ["ip", "-n", pod, "-6", "route", "add", "default", "via", INET_V6],
        ]
        for argv in commands:
            _run(argv)
        # `ip netns exec` bind-mounts this over /etc/resolv.conf: the pod's resolver, as in a real
        # pod, is an address outside it (the internet namespace's DNS); the rules redirect it.
        self.etc_netns_existed = ETC_NETNS.exists()
        (ETC_NETNS / pod).mkdir(parents=True)
        (ETC_NETNS / pod / "resolv.conf").write_text(f"nameserver {DNS_V4}\noptions timeout:2 attempts:1\n")
        return self

    def start_world(self, config: Mapping[str, Any]) -> None:
        self.world_dir.mkdir()
        (self.world_dir / "world.json").write_bytes(orjson.dumps(dict(config)))
        with (self.world_dir / "stderr.log").open("wb") as stderr:
            self.world = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.inet,
                    sys.executable,
                    "-m",
                    "tests.transparent.world",
                    str(self.world_dir),
                ],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        _wait_for((self.world_dir / "ready").exists, "world", self.world, self.world_dir / "stderr.log")

    def start_gateway(self, policy: Mapping[str, Any], env: Mapping[str, str] | None = None) -> None:
        directory = self.gateway_dir
        directory.mkdir()
        shutil.copy(self.world_dir / "test-ca.pem", directory / "test-ca.pem")
        self.write_policy(policy)
        (directory / "audit.log").touch()
        for path in (directory, *directory.iterdir()):
            os.chown(path, GATEWAY_UID, GATEWAY_UID)
        self.gateway_env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(directory),
            "EGRESS_POLICY": str(directory / "policy.yaml"),
            "EGRESS_PROXY_LISTEN": "127.0.0.1:3128",
            "EGRESS_API_LISTEN": "127.0.0.1:8080",
            "EGRESS_ADMIN_LISTEN": "127.0.0.1:9090",
            "EGRESS_TRANSPARENT_LISTEN": f"127.0.0.1:{TRANSPARENT_PORT},[::1]:{TRANSPARENT_PORT}",
            "EGRESS_DNS_LISTEN": f"127.0.0.1:{DNS_PORT},[::1]:{DNS_PORT}",
            "EGRESS_GATEWAY_UID": str(GATEWAY_UID),
            "EGRESS_NAMESERVERS": f"{DNS_V4}:53",
            "EGRESS_CA_BUNDLE": str(directory / "test-ca.pem"),
            "EGRESS_AUDIT_LOG": str(directory / "audit.log"),
            "EGRESS_SEARCH_ENGINES": "duckduckgo",
            **(env or {}),
        }
        with (self.dir / "gateway-stderr.log").open("wb") as stderr:
            self.gateway = subprocess.Popen(
                [*self.as_uid(GATEWAY_UID), sys.executable, "-m", "gateway", "serve"],
                cwd=directory,
                env=self.gateway_env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        _wait_for(
            lambda: " serving: policy " in (self.dir / "gateway-stderr.log").read_text(errors="replace"),
            "gateway",
            self.gateway,
            self.dir / "gateway-stderr.log",
        )

    def write_policy(self, policy: Mapping[str, Any]) -> None:
        path = self.gateway_dir / "policy.yaml"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(dict(policy), sort_keys=False))
        tmp.chmod(0o644)
        tmp.replace(path)

    def redirect(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`egress-gateway redirect ARGS` inside the pod, as root, with the gateway's settings."""
        return _run(
            ["ip", "netns", "exec", self.pod, sys.executable, "-m", "gateway", "redirect", *args],
            check=check,
            env=self.gateway_env,
            cwd=REPO,
        )

    # running ----------------------------------------------------------------------------------
    def as_uid(self, uid: int) -> list[str]:
        # CAP_DAC_READ_SEARCH only, and only so a non-root uid can run the interpreter, which may live
        # in root's home (pyenv); no network capability is kept.
        return [
            "ip",
            "netns",
            "exec",
            self.pod,
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--inh-caps=+dac_read_search",
            "--ambient-caps=+dac_read_search",
        ]

    def agent(self, *argv: str, uid: int = AGENT_UID) -> subprocess.CompletedProcess[str]:
        """Run a command in the pod as an agent uid, with no proxy settings at all."""
        env = {"PATH": os.environ.get("PATH", ""), "HOME": "/tmp"}
        return _run([*self.as_uid(uid), *argv], check=False, env=env)

    def agent_process(self, *argv: str, uid: int = AGENT_UID) -> subprocess.Popen[str]:
        """A long-running agent command with pipes, for a test that talks to it step by step."""
        env = {"PATH": os.environ.get("PATH", ""), "HOME": "/tmp"}
        return subprocess.Popen(
            [*self.as_uid(uid), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def curl(self, *args: str, uid: int = AGENT_UID) -> subprocess.CompletedProcess[str]:
        return self.agent(
            "curl", "-sS", "--max-time", "10", "--cacert", str(self.gateway_dir / "test-ca.pem"), *args, uid=uid
        )

    def dig(self, name: str, qtype: str = "A", *, server: str = DNS_V4, mode: str = "udp", uid: int = AGENT_UID) -> Any:
        """One query from an agent uid, sent to `server` port 53 (the rules redirect it)."""
        result = self.agent(sys.executable, "-c", DIG, name, qtype, server, mode, uid=uid)
        assert result.returncode == 0, result.stderr
        return orjson.loads(result.stdout)

    def audit(self) -> list[dict[str, Any]]:
        return audit_records(self.gateway_dir / "audit.log")

    def wait_audit(self, predicate: Any, timeout_s: float = 5.0, count: int = 1) -> list[dict[str, Any]]:
        """The audit lines once `count` of them match `predicate` (or the deadline passes)."""
        deadline = time.monotonic() + timeout_s
        lines = self.audit()
        while sum(1 for line in lines if predicate(line)) < count and time.monotonic() < deadline:
            time.sleep(0.02)
            lines = self.audit()
        return lines

    def metrics(self) -> str:
        """The gateway's /metrics, read from inside the pod (root's loopback is never redirected)."""
        url = "http://127.0.0.1:9090/metrics"
        return _run(["ip", "netns", "exec", self.pod, "curl", "-sS", "--max-time", "5", url]).stdout

    def schema_errors(self) -> list[str]:
        from tests.harness.audit_schema import file_errors  # noqa: PLC0415

        return file_errors(self.gateway_dir / "audit.log")

    def world_log(self, name: str) -> str:
        path = self.world_dir / name
        return path.read_text() if path.exists() else ""

    # removing ---------------------------------------------------------------------------------
    def destroy(self) -> None:
        for process in (self.gateway, self.world):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)
        for ns in (self.pod, self.inet):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                _run(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(ETC_NETNS / self.pod, ignore_errors=True)
        if not self.etc_netns_existed:
            with contextlib.suppress(OSError):
                ETC_NETNS.rmdir()
        with contextlib.suppress(OSError):
            note_file(self.gateway_dir / "audit.log")
        shutil.rmtree(self.dir, ignore_errors=True)


def _wait_for(ready: Any, what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}: {log.read_text(errors='replace')}")
        if ready():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready after {READY_TIMEOUT_S} s: {log.read_text(errors='replace')}")
