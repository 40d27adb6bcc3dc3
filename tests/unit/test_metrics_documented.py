"""Every metric the gateway registers is in the README's metrics table, and exports no `_created`."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest

from gateway.observe.metrics import REGISTRY

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_registered_metric_is_documented() -> None:
    missing = []
    for family in REGISTRY.collect():
        if not family.name.startswith("egress_gateway_"):
            continue
        name = family.name + ("_total" if family.type == "counter" else "")
        if f"`{name}`" not in README:
            missing.append(name)
    assert missing == []


def test_the_exposition_has_no_created_series_and_carries_process_metrics() -> None:
    text = generate_latest(REGISTRY).decode()
    assert "_created" not in text
    assert "process_cpu_seconds_total" in text
