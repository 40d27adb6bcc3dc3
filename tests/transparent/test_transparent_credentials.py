"""Brokered credentials on the transparent listener (issue 26): an agent with no proxy settings,
redirected by the kernel, holds only a placeholder. TLS to the bound host is terminated although
no `inspect` entry names it; the origin receives the real value and echoes it back, and the agent
reads the placeholder. The placeholder over plain HTTP (no binding holds for http) is refused
before anything reaches the origin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.credentials.placeholders import placeholder_for
from gateway.policy.load import parse_policy
from tests.harness.inspection import InterceptionCA, make_interception_ca
from tests.transparent.conftest import WORLD, transparent_policy
from tests.transparent.netns import ORIGIN_V4, Topology, require_netns

KEY = "k" * 48
VALUE = "corp-" + "TransparentV" * 3  # 41 characters


def _policy() -> dict[str, Any]:
    policy = transparent_policy()
    policy["credentials"] = {
        "placeholder_key": {"env": "TEST_PLACEHOLDER_KEY"},
        "entries": [
            {
                "name": "docs-api",
                "source": {"env": "TEST_DOCS_TOKEN"},
                "inject": "bearer",
                "placeholder": {"prefix": "corp-", "length": len(VALUE)},
                "bind": {"hosts": ["docs.example.org"]},
            }
        ],
    }
    return policy


def _placeholder() -> str:
    rule = parse_policy(yaml.safe_dump(_policy())).credentials.entries[0]
    return placeholder_for(KEY.encode(), rule)


@pytest.fixture(scope="module")
def bound_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Topology, InterceptionCA]]:
    require_netns()
    directory: Path = tmp_path_factory.mktemp("transparent-credentials-ca")
    ca = make_interception_ca(directory / "ca")
    for path in (directory, directory / "ca"):
        path.chmod(0o755)
    topology = Topology("cred")
    try:
        topology.build()
        topology.start_world(WORLD)
        topology.start_gateway(
            _policy(),
            env={
                "EGRESS_INSPECT_CA_CERT": str(ca.cert),
                "EGRESS_INSPECT_CA_KEY": str(ca.key),
                "TEST_PLACEHOLDER_KEY": KEY,
                "TEST_DOCS_TOKEN": VALUE,
            },
        )
        topology.redirect("--apply")
        yield topology, ca
    finally:
        topology.destroy()


def test_the_placeholder_becomes_the_value_and_comes_back_as_the_placeholder(
    bound_pod: tuple[Topology, InterceptionCA],
) -> None:
    pod, ca = bound_pod
    placeholder = _placeholder()
    result = pod.agent(
        "curl", "-sS", "--max-time", "10", "--cacert", str(ca.ca_only),
        "--resolve", f"docs.example.org:443:{ORIGIN_V4}",
        "-H", f"Authorization: Bearer {placeholder}", "https://docs.example.org/echo-auth",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"authorization=Bearer {placeholder}\n"
    lines = pod.wait_audit(lambda line: line.get("action") == "inject")
    injected = [line for line in lines if line.get("action") == "inject"]
    assert [(line["credential"], line["injected_into"], line["principal"]) for line in injected] == [
        ("docs-api", "authorization", "research")
    ]
    written = (pod.gateway_dir / "audit.log").read_text()
    assert VALUE not in written
    assert placeholder not in written


def test_the_placeholder_over_plain_http_is_refused_before_the_origin(
    bound_pod: tuple[Topology, InterceptionCA],
) -> None:
    pod, _ = bound_pod
    placeholder = _placeholder()
    result = pod.agent(
        "curl", "-sS", "--max-time", "10", "-w", "\n%{http_code}",
        "--resolve", f"docs.example.org:80:{ORIGIN_V4}",
        f"http://docs.example.org/echo-auth?leak={placeholder}",
    )  # fmt: skip
    assert result.stdout.endswith("\n403"), result.stdout
    assert "credential_misuse" in result.stdout
    assert "authorization=" not in result.stdout
    lines = pod.wait_audit(lambda line: line.get("event") == "security" and line.get("action") == "deny")
    denied = [line for line in lines if line.get("event") == "security" and line.get("action") == "deny"]
    assert denied[0]["findings"][0]["where"] == "url"
