"""Every metric the gateway registers is in the metrics reference (docs/reference/metrics.md), is updated by some code,
and exports no `_created`."""

from __future__ import annotations

import ast
from pathlib import Path

from prometheus_client import generate_latest

from gateway.observe.metrics import REGISTRY

METRICS_PAGE = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "metrics.md").read_text()
PACKAGE = Path(__file__).resolve().parents[2] / "gateway"
METRICS_SOURCE = PACKAGE / "observe" / "metrics.py"
METRIC_TYPES = frozenset({"Counter", "Gauge", "Histogram", "LoopCounter", "LoopHistogram"})


def test_every_registered_metric_is_documented() -> None:
    missing = []
    for family in REGISTRY.collect():
        if not family.name.startswith("egress_gateway_"):
            continue
        name = family.name + ("_total" if family.type == "counter" else "")
        if f"`{name}`" not in METRICS_PAGE:
            missing.append(name)
    assert missing == []


def test_the_exposition_has_no_created_series_and_carries_process_metrics() -> None:
    text = generate_latest(REGISTRY).decode()
    assert "_created" not in text
    assert "process_cpu_seconds_total" in text


def _metric_constants() -> dict[str, ast.AST]:
    tree = ast.parse(METRICS_SOURCE.read_text())
    constants: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            called = node.value.func
            if isinstance(called, ast.Name) and called.id in METRIC_TYPES:
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        constants[target.id] = node
    return constants


def _attributes_of_metrics_used_elsewhere() -> set[str]:
    """`metrics.NAME` (or `from gateway.observe.metrics import NAME`) anywhere in the package but metrics.py."""
    used: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if path == METRICS_SOURCE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "metrics":
                used.add(node.attr)
            elif isinstance(node, ast.ImportFrom) and node.module == "gateway.observe.metrics":
                used.update(alias.name for alias in node.names)
    return used


def test_no_metric_is_registered_without_code_that_updates_it() -> None:
    used = _attributes_of_metrics_used_elsewhere()
    tree = ast.parse(METRICS_SOURCE.read_text())
    # A metric updated by a helper of metrics.py counts when the helper is called from elsewhere.
    for function in (node for node in tree.body if isinstance(node, ast.FunctionDef)):
        if function.name in used:
            used.update(node.id for node in ast.walk(function) if isinstance(node, ast.Name))
    constants = _metric_constants()
    assert len(constants) >= 25
    assert sorted(name for name in constants if name not in used) == []
