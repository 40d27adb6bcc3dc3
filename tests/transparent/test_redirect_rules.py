"""`egress-gateway redirect` applied for real in a namespace of its own: idempotent, and removable
without a trace."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.transparent.conftest import transparent_policy
from tests.transparent.netns import REPO, require_netns


@pytest.fixture(scope="module")
def namespace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    require_netns()
    name = f"egt-rules-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    policy = tmp_path_factory.mktemp("rules") / "policy.yaml"
    policy.write_text(yaml.safe_dump(transparent_policy()))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "EGRESS_POLICY": str(policy),
        "EGRESS_TRANSPARENT_LISTEN": "127.0.0.1:15001,[::1]:15001",
        "EGRESS_DNS_LISTEN": "127.0.0.1:15053",
        "EGRESS_REDIRECT_EXCLUDE_CIDRS": "10.96.0.1/32,fd00::/8",
        "EGRESS_REDIRECT_EXCLUDE_PORTS": "6443",
    }
    try:
        yield name, env
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def _in(ns: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, env=env, cwd=REPO, timeout=30, check=False
    )


def _redirect(ns: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return _in(ns, sys.executable, "-m", "gateway", "redirect", *args, env=env)


def test_apply_twice_equals_apply_once_and_remove_restores_the_namespace(namespace: tuple[str, dict[str, str]]) -> None:
    ns, env = namespace
    before = _in(ns, "nft", "list", "ruleset").stdout
    first = _redirect(ns, env, "--apply")
    assert first.returncode == 0, first.stderr
    once = _in(ns, "nft", "list", "ruleset").stdout
    assert "table inet egress_gateway" in once
    assert "meta skuid 1000 meta l4proto tcp redirect to :15002" in once
    assert _redirect(ns, env, "--apply").returncode == 0
    assert _in(ns, "nft", "list", "ruleset").stdout == once
    removed = _redirect(ns, env, "--remove")
    assert removed.returncode == 0, removed.stderr
    assert _in(ns, "nft", "list", "ruleset").stdout == before
    # Removing what is not there is not an error either.
    assert _redirect(ns, env, "--remove").returncode == 0


def test_iptables_backend_installs_one_chain_and_removes_it(namespace: tuple[str, dict[str, str]]) -> None:
    ns, env = namespace
    if subprocess.run(["which", "iptables-restore"], capture_output=True, check=False).returncode != 0:
        pytest.fail("iptables is not installed (scripts/install-system-deps.sh installs it)")
    before = _in(ns, "nft", "list", "ruleset").stdout
    for _ in range(2):
        applied = _redirect(ns, env, "--apply", "--backend", "iptables")
        assert applied.returncode == 0, applied.stderr
    saved = _in(ns, "iptables-save").stdout
    assert saved.count("-A OUTPUT -j EGRESS_GW_OUTPUT") == 2  # nat and filter, once each
    assert "--uid-owner 1001 -j REDIRECT --to-ports 15003" in saved
    assert "-A EGRESS_GW_OUTPUT -j DROP" in saved
    assert "EGRESS_GW_OUTPUT -d fd00::/8 -j RETURN" in _in(ns, "ip6tables-save").stdout
    assert _redirect(ns, env, "--remove", "--backend", "iptables").returncode == 0
    assert "EGRESS_GW" not in _in(ns, "iptables-save").stdout
    assert "EGRESS_GW" not in _in(ns, "ip6tables-save").stdout
    # iptables-nft's emptied nat and filter tables go too: the namespace is as it was.
    assert _in(ns, "nft", "list", "ruleset").stdout == before


def test_iptables_remove_keeps_a_table_that_still_does_something(namespace: tuple[str, dict[str, str]]) -> None:
    ns, env = namespace
    assert _redirect(ns, env, "--apply", "--backend", "iptables").returncode == 0
    # Another tool's rule in the same table, added while ours are in place.
    smtp_drop = ["OUTPUT", "-p", "tcp", "--dport", "25", "-j", "DROP"]
    assert _in(ns, "iptables", "-w", "-t", "filter", "-A", *smtp_drop).returncode == 0
    try:
        assert _redirect(ns, env, "--remove", "--backend", "iptables").returncode == 0
        saved = _in(ns, "iptables-save").stdout
        assert "-A OUTPUT -p tcp -m tcp --dport 25 -j DROP" in saved
        assert "EGRESS_GW" not in saved
    finally:
        _in(ns, "iptables", "-w", "-t", "filter", "-D", *smtp_drop)
        _redirect(ns, env, "--remove", "--backend", "iptables")


def test_print_refuses_an_agent_uid_equal_to_the_gateway_uid(tmp_path: Path) -> None:
    policy = transparent_policy()
    policy["transparent"]["principals"] = {15337: "coder"}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "redirect", "--print", "--policy", str(path)],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", ""), "EGRESS_TRANSPARENT_LISTEN": "127.0.0.1:15001"},
        cwd=REPO,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "gateway's own" in result.stderr


def _saved(ns: str) -> str:
    """Both families' iptables rules and the nft ruleset, without the dump's dated comments."""
    dumps = [_in(ns, tool).stdout for tool in ("iptables-save", "ip6tables-save")]
    dumps.append(_in(ns, "nft", "list", "ruleset").stdout)
    return "\n".join(line for dump in dumps for line in dump.splitlines() if not line.startswith("#"))


@pytest.mark.parametrize("backend", ["iptables", "nftables"])
def test_print_is_exactly_what_apply_applies(namespace: tuple[str, dict[str, str]], backend: str) -> None:
    """Issue 29: `--print --backend iptables` left out the OUTPUT jumps `--apply` adds. The
    printed script, run by sh in a fresh namespace, leaves the very ruleset `--apply` leaves."""
    applied_ns, env = namespace
    printed_ns = f"{applied_ns}-p"
    subprocess.run(["ip", "netns", "add", printed_ns], check=True, capture_output=True)
    try:
        script = _redirect(applied_ns, env, "--print", "--backend", backend)
        assert script.returncode == 0, script.stderr
        if backend == "iptables":
            assert "iptables -w -t nat -I OUTPUT 1 -j EGRESS_GW_OUTPUT" in script.stdout
            assert "ip6tables -w -t filter -I OUTPUT 1 -j EGRESS_GW_OUTPUT" in script.stdout
        applied = _redirect(applied_ns, env, "--apply", "--backend", backend)
        assert applied.returncode == 0, applied.stderr
        # Twice, as --apply may be: the printed script is idempotent as well.
        for _ in range(2):
            ran = _in(printed_ns, "sh", "-c", script.stdout)
            assert ran.returncode == 0, ran.stderr
        assert _saved(printed_ns) == _saved(applied_ns)
        assert "EGRESS_GW_OUTPUT" in _saved(applied_ns) or "egress_gateway" in _saved(applied_ns)
    finally:
        _redirect(applied_ns, env, "--remove", "--backend", backend)
        subprocess.run(["ip", "netns", "del", printed_ns], check=False, capture_output=True)
