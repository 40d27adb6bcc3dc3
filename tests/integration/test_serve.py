"""`egress-gateway serve` as a real process: probes, metrics, reloads, clean SIGTERM."""

from __future__ import annotations

import re
import signal
import time
import urllib.request

import yaml

from tests.conftest import GatewayFactory
from tests.harness.gateway import GatewayProcess, policy_document


def metric_value(gateway: GatewayProcess, name: str, labels: str = "") -> float:
    with urllib.request.urlopen(f"{gateway.admin_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = re.compile(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", re.MULTILINE)
    match = pattern.search(text)
    assert match is not None, f"{name}{labels} not exported"
    return float(match.group(1))


def wait_for(predicate: object, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_probes_answer_and_metrics_are_exported(gateway_factory: GatewayFactory) -> None:
    gateway = gateway_factory(policy_document())
    with urllib.request.urlopen(f"{gateway.admin_url}/healthz", timeout=5) as response:
        assert response.status == 200
    status, body = gateway.readyz()
    assert status == 200
    assert body["checks"]["policy_loaded"] is True
    assert metric_value(gateway, "egress_gateway_policy_generation") == 1.0


def test_sigterm_exits_cleanly(gateway_factory: GatewayFactory) -> None:
    gateway = gateway_factory(policy_document())
    assert gateway.stop() == 0
    assert "Traceback" not in gateway.stderr()


def test_bad_policy_reload_keeps_the_last_good_policy(gateway_factory: GatewayFactory) -> None:
    gateway = gateway_factory(policy_document())
    gateway.policy_path.write_text("version: 1\ndefaults: {mode: sideways}\n")
    gateway.signal(signal.SIGHUP)
    assert wait_for(lambda: metric_value(gateway, "egress_gateway_policy_reloads_total", '{outcome="failure"}') >= 1)
    assert metric_value(gateway, "egress_gateway_policy_generation") == 1.0
    status, _ = gateway.readyz()
    assert status == 200
    assert "defaults.mode must be one of" in gateway.stderr()


def test_policy_file_change_is_picked_up_without_a_signal(gateway_factory: GatewayFactory) -> None:
    gateway = gateway_factory(policy_document())
    document = policy_document(defaults={"mode": "report"})
    gateway.policy_path.write_text(yaml.safe_dump(document) + "\n# changed\n")
    assert wait_for(lambda: metric_value(gateway, "egress_gateway_policy_generation") == 2.0)
