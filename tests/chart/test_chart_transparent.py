"""The chart's enforced sidecar: the redirect init container, the gateway under its own uid, the
agent under another, and the renders the chart refuses because they would undo the rules."""

from __future__ import annotations

import pytest

from .conftest import CI_DIR, LEGACY_KUBE_VERSION, Helm, env_of, gateway_container, gateway_pod_spec

GATEWAY_UID = 15337


@pytest.mark.parametrize("kube_version", ["1.29.0", "1.33.0", LEGACY_KUBE_VERSION])
def test_redirect_init_container_runs_first_with_net_admin_and_net_raw_only(helm: Helm, kube_version: str) -> None:
    pod = gateway_pod_spec(helm.render("sidecar-transparent", kube_version))
    redirect = pod["initContainers"][0]
    assert redirect["name"] == "egress-gateway-redirect"
    assert redirect["command"] == ["/opt/venv/bin/egress-gateway", "redirect", "--apply"]
    assert "restartPolicy" not in redirect  # runs once, to completion, before anything else
    ctx = redirect["securityContext"]
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]}
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    env = env_of(redirect)
    assert env["EGRESS_GATEWAY_UID"] == str(GATEWAY_UID)
    assert env["EGRESS_TRANSPARENT_LISTEN"] == "127.0.0.1:15001,[::1]:15001"
    assert env["EGRESS_REDIRECT_EXCLUDE_CIDRS"] == "10.96.0.1/32"
    assert env["EGRESS_POLICY"] == "/etc/egress-gateway/policy/policy.yaml"


@pytest.mark.parametrize("kube_version", ["1.33.0", LEGACY_KUBE_VERSION])
def test_gateway_runs_as_the_exempt_uid_and_listens_for_redirected_traffic(helm: Helm, kube_version: str) -> None:
    pod = gateway_pod_spec(helm.render("sidecar-transparent", kube_version))
    gateway = gateway_container(pod)
    ctx = gateway["securityContext"]
    assert ctx["runAsUser"] == ctx["runAsGroup"] == GATEWAY_UID
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    env = env_of(gateway)
    assert env["EGRESS_DNS_LISTEN"] == "127.0.0.1:15053,[::1]:15053"
    assert env["EGRESS_TRANSPARENT_LISTEN"] == "127.0.0.1:15001,[::1]:15001"
    [agent] = [c for c in pod["containers"] if c["name"] == "agent"]
    assert agent["securityContext"]["runAsUser"] == 1000
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_without_transparent_there_is_no_redirect_container(helm: Helm) -> None:
    pod = gateway_pod_spec(helm.render("sidecar-native", "1.33.0"))
    assert [c["name"] for c in pod["initContainers"]] == ["egress-gateway"]
    assert "EGRESS_TRANSPARENT_LISTEN" not in env_of(gateway_container(pod))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        pytest.param(["transparent.agentUids={15337}"], "an agent running as the gateway's uid", id="agent-as-gateway"),
        pytest.param(["transparent.agentUids={0}"], "run the agent as a non-root uid", id="agent-as-root"),
        pytest.param(["podSecurityContext.runAsUser=15337"], "would be exempt from the rules", id="pod-default-uid"),
        # The values schema already refuses any added capability; the template refuses NET_ADMIN too.
        pytest.param(["securityContext.capabilities.add={NET_ADMIN}"], "capabilities.add", id="net-admin"),
        pytest.param(["mode=deployment"], "transparent.enabled needs mode=sidecar", id="deployment-mode"),
    ],
)
def test_chart_refuses_an_agent_that_could_undo_the_rules(helm: Helm, override: list[str], message: str) -> None:
    extra = [arg for item in override for arg in ("--set", item)]
    result = helm.template([CI_DIR / "sidecar-transparent.yaml"], "1.33.0", extra)
    assert result.returncode != 0
    assert message in result.stderr
