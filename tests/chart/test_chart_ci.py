"""Every ci/ values file lints cleanly and renders manifests Kubernetes accepts.

`helm lint --strict` turns chart warnings into failures; `kubernetes-validate --strict` checks
each rendered object against the OpenAPI schema of the Kubernetes version it was rendered for,
rejecting unknown fields (a misplaced key that the API server would silently drop).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .conftest import CHART_DIR, CI_DIR, CI_FILES, KUBE_VERSIONS, RENDER_CASES, Helm

# kubernetes-validate has no schemas for CRDs; only these kinds may be reported as unknown.
CRD_KINDS = ("ServiceMonitor", "PodMonitor")


def test_ci_directory_covers_every_mode() -> None:
    assert {
        "deployment-default",
        "deployment-ha",
        "sidecar-native",
        "sidecar-legacy",
        "existing-configmap-and-secret",
    } <= set(CI_FILES)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values_file", CI_FILES)
def test_chart_lints_strictly(helm: Helm, values_file: str, kube_version: str) -> None:
    result = helm.run(
        "lint", "--strict", str(CHART_DIR),
        "-f", str(CI_DIR / f"{values_file}.yaml"),
        "--kube-version", kube_version,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("values_file", "kube_version"), RENDER_CASES)
def test_rendered_manifests_validate_against_kubernetes_schema(
    helm: Helm, kubernetes_validate: Path, values_file: str, kube_version: str
) -> None:
    render = helm.render(values_file, kube_version)
    assert render.docs, "nothing rendered"
    result = subprocess.run(
        [str(kubernetes_validate), "--strict", "--quiet", "-k", kube_version, "-"],
        input=render.text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "ERROR" not in output, output
    for line in output.splitlines():
        if line.startswith("WARN"):
            assert any(kind in line for kind in CRD_KINDS), line
