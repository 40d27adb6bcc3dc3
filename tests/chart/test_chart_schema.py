"""values.schema.json rejects typos and wrong types before anything renders, and the chart
refuses combinations that would deploy a broken or unsafe gateway."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import CHART_DIR, RELEASE, Helm

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())


def walk_objects(node: Any, path: str = "$") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if "properties" in node:
            found.append((path, node))
        for key, child in node.items():
            found.extend(walk_objects(child, f"{path}.{key}"))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found.extend(walk_objects(child, f"{path}[{index}]"))
    return found


def test_every_schema_object_with_properties_is_closed() -> None:
    objects = walk_objects(SCHEMA)
    assert len(objects) > 20
    open_objects = [path for path, node in objects if node.get("additionalProperties") is not False]
    assert open_objects == []


def test_chart_defaults_satisfy_the_schema_and_cover_every_key() -> None:
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert set(defaults) <= set(SCHEMA["properties"])
    assert set(SCHEMA["properties"]) - set(defaults) == {"global"}


BAD_VALUES = {
    "typo-top-level": ({"replicaCont": 3}, "replicaCont"),
    "typo-nested": ({"networkPolicy": {"enabeld": True}}, "enabeld"),
    "typo-in-probe": ({"probes": {"readiness": {"pth": "/readyz"}}}, "pth"),
    "replicas-as-string": ({"replicaCount": "three"}, "replicaCount"),
    "port-out-of-range": ({"ports": {"proxy": 70000}}, "ports.proxy"),
    "port-as-string": ({"ports": {"admin": "9090"}}, "ports.admin"),
    "unknown-mode": ({"mode": "transparent"}, "mode"),
    "writable-root-fs": ({"securityContext": {"readOnlyRootFilesystem": False}}, "readOnlyRoot"),
    "root-user": ({"podSecurityContext": {"runAsNonRoot": False}}, "runAsNonRoot"),
    "added-capability": ({"securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}, "add"),
    "egress-ports-not-a-list": ({"networkPolicy": {"egressPorts": 443}}, "egressPorts"),
    "except-not-a-cidr": ({"networkPolicy": {"exceptCIDRs": ["metadata"]}}, "exceptCIDRs"),
    "checksum-as-string": ({"policy": {"checksumAnnotation": "yes"}}, "checksumAnnotation"),
}


@pytest.mark.parametrize(("values", "mentions"), BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_schema_rejects_bad_values_in_template_and_lint(
    helm: Helm, tmp_path: Path, values: dict[str, Any], mentions: str
) -> None:
    values_file = tmp_path / "bad.yaml"
    values_file.write_text(yaml.safe_dump(values))
    rendered = helm.template([values_file], "1.33.0")
    assert rendered.returncode != 0, rendered.stdout
    assert "schema" in rendered.stderr
    assert mentions in rendered.stderr
    linted = helm.run("lint", "--strict", str(CHART_DIR), "-f", str(values_file))
    assert linted.returncode != 0
    assert mentions in linted.stdout + linted.stderr


@pytest.mark.parametrize(
    ("settings", "mentions"),
    [
        (["shutdown.terminationGracePeriodSeconds=20"], "terminationGracePeriodSeconds"),
        (["mode=sidecar", "metrics.serviceMonitor.enabled=true"], "serviceMonitor"),
        (["networkPolicy.enabled=true", "networkPolicy.redis.enabled=true"], "redis.to"),
    ],
    ids=["grace-not-above-prestop-plus-drain", "servicemonitor-in-sidecar", "redis-without-peer"],
)
def test_chart_refuses_unsafe_combinations(helm: Helm, settings: list[str], mentions: str) -> None:
    args = ["template", RELEASE, str(CHART_DIR)]
    for setting in settings:
        args += ["--set", setting]
    result = helm.run(*args)
    assert result.returncode != 0, result.stdout
    assert mentions in result.stderr
