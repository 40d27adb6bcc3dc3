"""The chart's TLS interception (issue 25): the CA Secret mounted into the gateway only, the
agents' trust files and variables rendered by the helper templates, and the renders refused."""

from __future__ import annotations

import pytest

from .conftest import CI_DIR, LEGACY_KUBE_VERSION, Helm, env_of, gateway_container, gateway_pod_spec

TRUST_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "NPM_CONFIG_CAFILE",
)


@pytest.mark.parametrize("kube_version", ["1.29.0", "1.33.0", LEGACY_KUBE_VERSION])
def test_the_ca_secret_is_mounted_into_the_gateway_and_named_by_its_settings(helm: Helm, kube_version: str) -> None:
    pod = gateway_pod_spec(helm.render("sidecar-inspection", kube_version))
    gateway = gateway_container(pod)
    env = env_of(gateway)
    assert env["EGRESS_INSPECT_CA_CERT"] == "/etc/egress-gateway/inspect-ca/tls.crt"
    assert env["EGRESS_INSPECT_CA_KEY"] == "/etc/egress-gateway/inspect-ca/tls.key"
    mounts = {m["name"]: m for m in gateway["volumeMounts"]}
    assert mounts["egress-gateway-inspect-ca"] == {
        "name": "egress-gateway-inspect-ca",
        "mountPath": "/etc/egress-gateway/inspect-ca",
        "readOnly": True,
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    secret = volumes["egress-gateway-inspect-ca"]["secret"]
    assert secret == {"secretName": "egress-interception-ca", "defaultMode": 0o440}


@pytest.mark.parametrize("kube_version", ["1.33.0", LEGACY_KUBE_VERSION])
def test_the_agent_gets_the_trust_bundle_and_every_trust_variable(helm: Helm, kube_version: str) -> None:
    pod = gateway_pod_spec(helm.render("sidecar-inspection", kube_version))
    (agent,) = [c for c in pod["containers"] if c["name"] == "agent"]
    env = env_of(agent)
    for name in TRUST_VARIABLES:
        assert env[name] == "/etc/egress-gateway/trust/bundle.pem", name
    assert env["NODE_EXTRA_CA_CERTS"] == "/etc/egress-gateway/trust/ca.pem"  # additive: the CA alone
    assert env["HTTPS_PROXY"].startswith("http://127.0.0.1:")
    assert agent["volumeMounts"] == [
        {"name": "egress-gateway-trust", "mountPath": "/etc/egress-gateway/trust", "readOnly": True}
    ]
    # The agent never mounts the CA's key.
    assert "egress-gateway-inspect-ca" not in {m["name"] for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["egress-gateway-trust"]["configMap"]["name"] == "egress-interception-trust"
    assert {item["key"] for item in volumes["egress-gateway-trust"]["configMap"]["items"]} == {"ca.pem", "bundle.pem"}


def test_without_inspection_nothing_of_it_is_rendered(helm: Helm) -> None:
    render = helm.render("sidecar-native", "1.33.0")
    assert "inspect-ca" not in render.text
    assert "SSL_CERT_FILE" not in render.text


@pytest.mark.parametrize(
    "missing", ["inspection.caSecret=", "inspection.trustConfigMap="], ids=["no-ca-secret", "no-trust-configmap"]
)
def test_inspection_without_its_secret_or_configmap_is_refused(helm: Helm, missing: str) -> None:
    result = helm.template([CI_DIR / "sidecar-inspection.yaml"], "1.33.0", ["--set", missing])
    assert result.returncode != 0
    assert "inspection.enabled needs inspection.caSecret" in result.stderr
