"""What the rendered manifests must say: hardening, probes, sidecar shapes, PDB and HPA rules,
the policy ConfigMap, the Secret and the checksum annotations."""

from __future__ import annotations

import base64

import pytest
import yaml

from .conftest import (
    CHART_DIR,
    KUBE_VERSIONS,
    LEGACY_KUBE_VERSION,
    RELEASE,
    Helm,
    Manifest,
    chart_values,
    env_of,
    gateway_container,
    gateway_pod_spec,
)

FULLNAME = f"{RELEASE}-egress-gateway"
GATEWAY_RENDERS = [
    ("deployment-default", "1.33.0"),
    ("deployment-ha", "1.29.0"),
    ("existing-configmap-and-secret", "1.33.0"),
    ("sidecar-native", "1.29.0"),
    ("sidecar-native", LEGACY_KUBE_VERSION),
    ("sidecar-legacy", "1.33.0"),
]
RENDER_IDS = [f"{name}@{version}" for name, version in GATEWAY_RENDERS]


@pytest.mark.parametrize(("values_file", "kube_version"), GATEWAY_RENDERS, ids=RENDER_IDS)
def test_gateway_pod_is_hardened(helm: Helm, values_file: str, kube_version: str) -> None:
    pod = gateway_pod_spec(helm.render(values_file, kube_version))
    assert pod["automountServiceAccountToken"] is False
    pod_ctx = pod["securityContext"]
    assert pod_ctx["runAsNonRoot"] is True
    assert pod_ctx["runAsUser"] == pod_ctx["runAsGroup"] == pod_ctx["fsGroup"] == 65532
    assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}

    ctx = gateway_container(pod)["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert ctx["runAsUser"] == ctx["runAsGroup"] == 65532
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize(("values_file", "kube_version"), GATEWAY_RENDERS, ids=RENDER_IDS)
def test_tmp_is_an_empty_dir_because_the_root_filesystem_is_read_only(
    helm: Helm, values_file: str, kube_version: str
) -> None:
    pod = gateway_pod_spec(helm.render(values_file, kube_version))
    mounts = {m["mountPath"]: m["name"] for m in gateway_container(pod)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


@pytest.mark.parametrize(("values_file", "kube_version"), GATEWAY_RENDERS, ids=RENDER_IDS)
def test_probes_hit_healthz_and_readyz_on_the_admin_port(helm: Helm, values_file: str, kube_version: str) -> None:
    container = gateway_container(gateway_pod_spec(helm.render(values_file, kube_version)))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"proxy": 3128, "api": 8080, "admin": 9090}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert env_of(container)["EGRESS_ADMIN_LISTEN"] == "0.0.0.0:9090"


@pytest.mark.parametrize(("values_file", "kube_version"), GATEWAY_RENDERS, ids=RENDER_IDS)
def test_grace_period_outlasts_prestop_wait_and_drain(helm: Helm, values_file: str, kube_version: str) -> None:
    pod = gateway_pod_spec(helm.render(values_file, kube_version))
    shutdown = chart_values(values_file)["shutdown"]
    container = gateway_container(pod)
    prestop_s = 0
    if "lifecycle" in container:
        command = container["lifecycle"]["preStop"]["exec"]["command"]
        assert command[0] == "/bin/sleep"
        prestop_s = int(command[1])
    assert pod["terminationGracePeriodSeconds"] > prestop_s + shutdown["drainSeconds"]


def test_chart_refuses_a_grace_period_shorter_than_the_drain(helm: Helm) -> None:
    result = helm.run(
        "template", RELEASE, str(CHART_DIR),
        "--set", "shutdown.terminationGracePeriodSeconds=10",
    )  # fmt: skip
    assert result.returncode != 0
    assert "terminationGracePeriodSeconds" in result.stderr


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_native_sidecar_is_a_restartable_init_container_gated_on_readyz(helm: Helm, kube_version: str) -> None:
    pod = gateway_pod_spec(helm.render("sidecar-native", kube_version))
    [sidecar] = pod["initContainers"]
    assert sidecar["name"] == "egress-gateway"
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    # The kubelet stops a native sidecar after the app containers: no preStop wait needed.
    assert "lifecycle" not in sidecar
    assert [c["name"] for c in pod["containers"]] == ["agent"]


@pytest.mark.parametrize(
    ("values_file", "kube_version"),
    [
        ("sidecar-native", LEGACY_KUBE_VERSION),
        ("sidecar-legacy", LEGACY_KUBE_VERSION),
        ("sidecar-legacy", "1.33.0"),
    ],
    ids=["auto-fallback-1.28", "forced-legacy-1.28", "forced-legacy-1.33"],
)
def test_legacy_sidecar_is_a_plain_container_with_a_prestop_wait(
    helm: Helm, values_file: str, kube_version: str
) -> None:
    pod = gateway_pod_spec(helm.render(values_file, kube_version))
    assert not pod.get("initContainers")
    assert [c["name"] for c in pod["containers"]] == ["agent", "egress-gateway"]
    sidecar = gateway_container(pod)
    assert "restartPolicy" not in sidecar
    assert "startupProbe" not in sidecar
    expected_s = chart_values(values_file)["shutdown"]["preStopSleepSeconds"]
    assert sidecar["lifecycle"]["preStop"]["exec"]["command"] == ["/bin/sleep", str(expected_s)]


@pytest.mark.parametrize(
    ("values_file", "kube_version", "host"),
    [
        ("deployment-default", "1.33.0", "0.0.0.0"),
        ("sidecar-native", "1.33.0", "127.0.0.1"),
        ("sidecar-legacy", LEGACY_KUBE_VERSION, "127.0.0.1"),
    ],
)
def test_proxy_and_api_bind_per_mode(helm: Helm, values_file: str, kube_version: str, host: str) -> None:
    env = env_of(gateway_container(gateway_pod_spec(helm.render(values_file, kube_version))))
    assert env["EGRESS_PROXY_LISTEN"] == f"{host}:3128"
    assert env["EGRESS_API_LISTEN"] == f"{host}:8080"


@pytest.mark.parametrize(
    ("values_file", "kube_version"),
    [("sidecar-native", "1.33.0"), ("sidecar-legacy", LEGACY_KUBE_VERSION)],
)
def test_sidecar_agent_env_sets_both_spellings_of_the_proxy_variables(
    helm: Helm, values_file: str, kube_version: str
) -> None:
    pod = gateway_pod_spec(helm.render(values_file, kube_version))
    [agent] = [c for c in pod["containers"] if c["name"] == "agent"]
    env = env_of(agent)
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        assert env[name] == "http://127.0.0.1:3128"
    for name in ("NO_PROXY", "no_proxy"):
        assert env[name].split(",")[:3] == ["localhost", "127.0.0.1", "::1"]


@pytest.mark.parametrize(
    ("values_file", "extra", "expect_pdb"),
    [
        ("deployment-default", (), True),
        ("deployment-ha", (), True),
        ("existing-configmap-and-secret", (), False),
        ("deployment-default", ("--set", "replicaCount=1"), False),
        ("deployment-ha", ("--set", "autoscaling.minReplicas=1"), False),
        ("sidecar-native", (), False),
    ],
    ids=["replicas-2", "hpa-min-3", "replicas-1", "set-replicas-1", "hpa-min-1", "sidecar"],
)
def test_pdb_only_when_more_than_one_replica(
    helm: Helm, values_file: str, extra: tuple[str, ...], expect_pdb: bool
) -> None:
    render = helm.render_custom(values_file, "1.33.0", extra)
    pdbs = render.all("PodDisruptionBudget")
    assert len(pdbs) == int(expect_pdb)
    if pdbs:
        deployment = render.one("Deployment")
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert pdbs[0]["spec"]["selector"]["matchLabels"] == selector


def test_hpa_owns_the_replica_count_when_enabled(helm: Helm) -> None:
    render = helm.render("deployment-ha", "1.33.0")
    hpa = render.one("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["minReplicas"] == 3
    assert hpa["spec"]["scaleTargetRef"]["name"] == FULLNAME
    assert "replicas" not in render.one("Deployment")["spec"]
    assert not helm.render("deployment-default", "1.33.0").all("HorizontalPodAutoscaler")


def test_service_monitor_scrapes_admin_metrics_and_is_off_by_default(helm: Helm) -> None:
    monitor = helm.render("deployment-ha", "1.33.0").one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"][0]["port"] == "admin"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    service = helm.render("deployment-ha", "1.33.0").one("Service")
    assert "admin" in {p["name"] for p in service["spec"]["ports"]}
    assert not helm.render("deployment-default", "1.33.0").all("ServiceMonitor")


def test_sidecar_mode_renders_only_configmap_secret_and_the_example(helm: Helm) -> None:
    render = helm.render("sidecar-native", "1.33.0")
    assert not render.all("Service")
    assert render.one("ConfigMap")["metadata"]["name"] == f"{FULLNAME}-policy"
    assert render.one("Secret")["metadata"]["name"] == FULLNAME
    assert render.one("Deployment")["metadata"]["name"] == f"{FULLNAME}-example"


def test_policy_configmap_holds_the_inline_policy_mounted_as_a_directory(helm: Helm) -> None:
    render = helm.render("deployment-ha", "1.33.0")
    configmap = render.one("ConfigMap")
    policy = yaml.safe_load(configmap["data"]["policy.yaml"])
    assert policy == chart_values("deployment-ha")["policy"]["inline"]
    pod = gateway_pod_spec(render)
    container = gateway_container(pod)
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "egress-gateway-policy"]
    # A subPath mount never sees ConfigMap updates, which would defeat hot reload.
    assert "subPath" not in mount
    assert env_of(container)["EGRESS_POLICY"] == f"{mount['mountPath']}/policy.yaml"


def test_existing_configmap_and_secret_are_referenced_not_rendered(helm: Helm) -> None:
    render = helm.render("existing-configmap-and-secret", "1.33.0")
    assert not render.all("ConfigMap")
    assert not render.all("Secret")
    pod = gateway_pod_spec(render)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["egress-gateway-policy"]["configMap"]["name"] == "agent-egress-policy"
    container = gateway_container(pod)
    env = env_of(container)
    assert env["EGRESS_POLICY"].endswith("/gateway-policy.yaml")
    assert env["EGRESS_SEARCH_TAVILY_KEY"]["secretKeyRef"] == {
        "name": "agent-egress-secrets",
        "key": "EGRESS_SEARCH_TAVILY_KEY",
        "optional": True,
    }
    annotations = render.one("Deployment")["spec"]["template"]["metadata"].get("annotations", {})
    assert "checksum/policy" not in annotations


def test_secret_holds_engine_keys_and_agent_tokens(helm: Helm) -> None:
    render = helm.render("deployment-ha", "1.33.0")
    data = render.one("Secret")["data"]
    decoded = {key: base64.b64decode(value).decode() for key, value in data.items()}
    assert decoded["EGRESS_SEARCH_TAVILY_KEY"] == "tvly-ci-not-a-real-key"
    assert decoded["EGRESS_REDIS_URL"].startswith("redis+sentinel://")
    assert decoded["EGRESS_RUN_TOKEN_SECRET"] == "ci-run-token-secret-not-a-real-one-0123"
    assert decoded["token-research-agent"] == "ci-token-not-secret"
    env = env_of(gateway_container(gateway_pod_spec(render)))
    for name in ("EGRESS_SEARCH_TAVILY_KEY", "EGRESS_SEARCH_EXA_KEY",
                 "EGRESS_SEARCH_BRAVE_API_KEY", "EGRESS_FETCH_READER_KEY", "EGRESS_REDIS_URL",
                 "EGRESS_RUN_TOKEN_SECRET"):  # fmt: skip
        assert env[name]["secretKeyRef"]["name"] == FULLNAME
    # Tokens are for agents; the gateway only knows their hashes from the policy.
    assert not any(name.startswith("token") for name in env)


def pod_annotations(render_manifest: Manifest) -> dict[str, str]:
    annotations: dict[str, str] = render_manifest["spec"]["template"]["metadata"]["annotations"]
    return annotations


def test_checksum_annotation_changes_with_the_policy(helm: Helm) -> None:
    before = pod_annotations(helm.render("deployment-default", "1.33.0").one("Deployment"))
    after = pod_annotations(
        helm.render_custom("deployment-default", "1.33.0", ("--set", "policy.inline.defaults.mode=report")).one(
            "Deployment"
        )
    )
    assert before["checksum/policy"] != after["checksum/policy"]
    assert before["checksum/secret"] == after["checksum/secret"]
    sidecar_pod = helm.render("sidecar-native", "1.33.0").one("Deployment")
    assert "checksum/policy" in pod_annotations(sidecar_pod)


def test_checksum_annotation_can_be_left_to_hot_reload(helm: Helm) -> None:
    render = helm.render_custom("deployment-default", "1.33.0", ("--set", "policy.checksumAnnotation=false"))
    assert "checksum/policy" not in pod_annotations(render.one("Deployment"))
