"""Fixtures for the chart tests: a real helm binary and a cache of rendered manifests.

No cluster is involved: `helm template` renders, `kubernetes-validate` checks the output against
the Kubernetes OpenAPI schemas, and the tests read the YAML. helm must be installed (by
scripts/install-helm.sh into .tools/bin, or on PATH); its absence is a failure, never a skip,
so a CI box without it cannot pass the chart checks by accident.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "egress-gateway"
CI_DIR = CHART_DIR / "ci"
RELEASE = "egw"
NAMESPACE = "agents"

# Native sidecars are beta (on by default) from 1.29 and GA in 1.33; 1.28 is the last
# version where the chart must fall back to the legacy sidecar shape.
KUBE_VERSIONS = ("1.29.0", "1.33.0")
LEGACY_KUBE_VERSION = "1.28.0"

CI_FILES = sorted(p.stem for p in CI_DIR.glob("*.yaml"))
RENDER_CASES = [(name, version) for name in CI_FILES for version in KUBE_VERSIONS] + [
    (name, LEGACY_KUBE_VERSION) for name in CI_FILES if name.startswith("sidecar-")
]

Manifest = dict[str, Any]


def find_helm() -> Path:
    local = REPO_ROOT / ".tools" / "bin" / "helm"
    if local.is_file():
        return local
    on_path = shutil.which("helm")
    if on_path:
        return Path(on_path)
    pytest.fail(
        "helm not found at .tools/bin/helm or on PATH: run scripts/install-helm.sh",
        pytrace=False,
    )


def find_kubernetes_validate() -> Path:
    for candidate in (
        Path(sys.executable).parent / "kubernetes-validate",
        REPO_ROOT / ".venv" / "bin" / "kubernetes-validate",
    ):
        if candidate.is_file():
            return candidate
    on_path = shutil.which("kubernetes-validate")
    if on_path:
        return Path(on_path)
    pytest.fail("kubernetes-validate not found: pip install -e '.[dev]'", pytrace=False)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's values coalescing for maps: override wins, nested maps merge, lists replace."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def chart_values(values_file: str) -> dict[str, Any]:
    """The effective values of a ci/ file: chart defaults with the file merged over them."""
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    overlay = yaml.safe_load((CI_DIR / f"{values_file}.yaml").read_text()) or {}
    return deep_merge(defaults, overlay)


@dataclass(frozen=True, slots=True)
class Render:
    values_file: str
    kube_version: str
    text: str
    docs: list[Manifest] = field(repr=False)

    def all(self, kind: str) -> list[Manifest]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> Manifest:
        found = [d for d in self.all(kind) if name is None or d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
        return found[0]


@dataclass
class Helm:
    """Runs the real helm against the chart; renders of ci/ files are cached per version."""

    binary: Path
    _cache: dict[tuple[str, str], Render] = field(default_factory=dict)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.binary), *args], capture_output=True, text=True, timeout=60, check=False)

    def template(
        self, values_files: Sequence[Path], kube_version: str, extra: Sequence[str] = ()
    ) -> subprocess.CompletedProcess[str]:
        args = ["template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE]
        args += ["--kube-version", kube_version]
        for path in values_files:
            args += ["-f", str(path)]
        return self.run(*args, *extra)

    def render_custom(self, values_file: str, kube_version: str, extra: Sequence[str] = ()) -> Render:
        result = self.template([CI_DIR / f"{values_file}.yaml"], kube_version, extra)
        assert result.returncode == 0, result.stderr
        docs = [d for d in yaml.safe_load_all(result.stdout) if d]
        return Render(values_file, kube_version, result.stdout, docs)

    def render(self, values_file: str, kube_version: str) -> Render:
        key = (values_file, kube_version)
        if key not in self._cache:
            self._cache[key] = self.render_custom(values_file, kube_version)
        return self._cache[key]


@pytest.fixture(scope="session")
def helm() -> Helm:
    return Helm(find_helm())


@pytest.fixture(scope="session")
def kubernetes_validate() -> Path:
    return find_kubernetes_validate()


def gateway_pod_spec(render: Render) -> Manifest:
    """The pod spec that carries the gateway: its Deployment, or the example agent workload."""
    deployments = render.all("Deployment")
    assert len(deployments) == 1, [d["metadata"]["name"] for d in deployments]
    spec: Manifest = deployments[0]["spec"]["template"]["spec"]
    return spec


def gateway_container(pod_spec: Manifest) -> Manifest:
    containers = pod_spec.get("initContainers", []) + pod_spec["containers"]
    found = [c for c in containers if c["name"] == "egress-gateway"]
    assert len(found) == 1, [c["name"] for c in containers]
    container: Manifest = found[0]
    return container


def env_of(container: Manifest) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.fixture
def chart_copy(tmp_path: Path) -> Path:
    """A scratch copy of the chart, for tests that must add a file to render it."""
    target = tmp_path / "egress-gateway"
    shutil.copytree(CHART_DIR, target)
    return target
