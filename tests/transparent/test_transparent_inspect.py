"""Inspection on the transparent listener (issue 25): an agent with no proxy settings, redirected
by the kernel, reaches an inspected host through a terminated TLS connection whose requests are
judged one by one; a host that is not inspected is still spliced."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.inspection import InterceptionCA, make_interception_ca
from tests.transparent.conftest import WORLD, transparent_policy
from tests.transparent.netns import CODER_UID, ORIGIN_V4, OTHER_V4, Topology, require_netns


def _policy() -> dict[str, Any]:
    policy = transparent_policy()
    policy["principals"]["research"]["inspect"] = [
        {"host": "docs.example.org", "access": "read-only", "deny": [{"id": "no-admin", "paths": ["/admin/**"]}]}
    ]
    return policy


@pytest.fixture(scope="module")
def inspected_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Topology, InterceptionCA]]:
    require_netns()
    directory: Path = tmp_path_factory.mktemp("transparent-ca")
    ca = make_interception_ca(directory / "ca")
    # The agent uid reads the CA; the key stays 0600 (the gateway reads it with DAC_READ_SEARCH).
    for path in (directory, directory / "ca"):
        path.chmod(0o755)
    topology = Topology("insp")
    try:
        topology.build()
        topology.start_world(WORLD)
        topology.start_gateway(
            _policy(), env={"EGRESS_INSPECT_CA_CERT": str(ca.cert), "EGRESS_INSPECT_CA_KEY": str(ca.key)}
        )
        topology.redirect("--apply")
        yield topology, ca
    finally:
        topology.destroy()


def _curl(pod: Topology, ca: InterceptionCA, *args: str, uid: int | None = None) -> Any:
    extra = {"uid": uid} if uid is not None else {}
    return pod.agent(
        "curl", "-sS", "--max-time", "10", "--cacert", str(ca.ca_only), "-w", "\n%{http_code}", *args, **extra
    )


def test_transparent_tls_to_an_inspected_host_is_judged_per_request(
    inspected_pod: tuple[Topology, InterceptionCA],
) -> None:
    pod, ca = inspected_pod
    resolve = ["--resolve", f"docs.example.org:443:{ORIGIN_V4}"]
    allowed = _curl(pod, ca, "https://docs.example.org/page", *resolve)
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout == f"origin={ORIGIN_V4} host=docs.example.org\n\n200"
    assert _curl(pod, ca, "https://docs.example.org/admin/x", *resolve).stdout.endswith("\n403")
    assert _curl(pod, ca, "-X", "POST", "https://docs.example.org/page", *resolve).stdout.endswith("\n403")
    # The last request's line: the audit log is flushed in order, so the earlier ones are there too.
    lines = pod.wait_audit(
        lambda line: line.get("kind") == "inspect" and line.get("method") == "POST" and line.get("decision") == "deny"
    )
    inspect = [line for line in lines if line.get("kind") == "inspect"]
    assert {(line["method"], line["path"], line["decision"]) for line in inspect} >= {
        ("GET", "/page", "allow"),
        ("GET", "/admin/x", "deny"),
        ("POST", "/page", "deny"),
    }
    assert all(line["principal"] == "research" for line in inspect)
    transparent_conns = {line["conn"] for line in lines if line.get("kind") == "transparent"}
    assert {line["conn"] for line in inspect} <= transparent_conns


def test_a_host_not_inspected_is_still_spliced_on_the_transparent_listener(
    inspected_pod: tuple[Topology, InterceptionCA],
) -> None:
    pod, _ = inspected_pod
    # The origin's own test CA only: a terminated connection would fail this handshake.
    result = pod.curl("https://code.example.net/", "--resolve", f"code.example.net:443:{OTHER_V4}", uid=CODER_UID)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"origin={OTHER_V4} host=code.example.net\n"
