"""NOTES.txt tells agents the env vars to set, with the right proxy address for each mode.

`helm template` does not render NOTES.txt and `helm install --dry-run` needs a cluster, so a
scratch copy of the chart gets one extra template that renders NOTES.txt through `tpl`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from .conftest import CI_DIR, NAMESPACE, RELEASE, Helm

FULLNAME = f"{RELEASE}-egress-gateway"
NO_PROXY = "localhost,127.0.0.1,::1,.svc,.cluster.local"


def render_notes(helm: Helm, chart: Path, values_file: str, kube_version: str) -> str:
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes-under-test.txt")
    (chart / "templates" / "zz-notes-under-test.yaml").write_text(
        'text: {{ tpl (.Files.Get "notes-under-test.txt") . | toJson }}\n'
    )
    result = helm.run(
        "template", RELEASE, str(chart), "--namespace", NAMESPACE,
        "-f", str(CI_DIR / f"{values_file}.yaml"), "--kube-version", kube_version,
        "--show-only", "templates/zz-notes-under-test.yaml",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    text: str = yaml.safe_load(result.stdout)["text"]
    return text


@pytest.mark.parametrize(
    ("values_file", "proxy_url", "verdict"),
    [
        (
            "deployment-default",
            f"http://{FULLNAME}.{NAMESPACE}.svc.cluster.local:3128",
            "ADVISORY: networkPolicy.enabled is false",
        ),
        ("deployment-ha", f"http://{FULLNAME}.{NAMESPACE}.svc.cluster.local:3128", "ENFORCED"),
        ("sidecar-native", "http://127.0.0.1:3128", "ADVISORY: the proxy env vars"),
    ],
)
def test_notes_print_the_proxy_env_for_each_mode(
    helm: Helm, chart_copy: Path, values_file: str, proxy_url: str, verdict: str
) -> None:
    notes = render_notes(helm, chart_copy, values_file, "1.33.0")
    lines = set(notes.splitlines())
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        assert f"  {name}={proxy_url}" in lines
    for name in ("NO_PROXY", "no_proxy"):
        assert f"  {name}={NO_PROXY}" in lines
    assert verdict in notes
    assert "hot-reloaded" in notes


@pytest.mark.parametrize(
    ("kube_version", "shape"),
    [("1.33.0", "native sidecars"), ("1.28.0", "no native sidecars")],
)
def test_sidecar_notes_say_which_sidecar_shape_was_chosen(
    helm: Helm, chart_copy: Path, kube_version: str, shape: str
) -> None:
    notes = render_notes(helm, chart_copy, "sidecar-native", kube_version)
    assert f"This cluster {'has' if shape.startswith('no') else 'supports'} {shape}" in notes
