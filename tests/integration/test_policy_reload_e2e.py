"""Policy reload through the real daemon (issue 12): a SIGHUP or a rewrite with the same content
keeps the generation, so a tool call in flight is not dropped with `policy_changed`; the
readiness probe says when the policy file is gone."""

from __future__ import annotations

import signal
import time

from tests.conftest import GatewayFactory
from tests.harness.budget_calls import HoldingSite
from tests.harness.gateway import policy_document
from tests.harness.origins import HarnessLoop, OriginFactory
from tests.harness.principals import (
    FETCHER_TOKEN,
    policy_generation,
    start_held_fetch,
    token_policy,
    token_principal,
)

SETTLE_S = 2.0  # four watcher polls: a reload, had one been due, would have happened


def test_sighup_and_a_same_content_rewrite_keep_a_call_in_flight(
    gateway_factory: GatewayFactory, origins: OriginFactory, harness_loop: HarnessLoop
) -> None:
    site = HoldingSite(harness_loop)
    origin = origins.start(site.app(), names=["docs.example.org"])
    policy = token_policy(origin, principals={"fetcher": token_principal(FETCHER_TOKEN, fetch=True)})
    gateway = gateway_factory(policy)
    caller, outcome = start_held_fetch(gateway, site, origin)
    try:
        gateway.write_policy(policy)  # same content, new inode and mtime
        gateway.signal(signal.SIGHUP)
        time.sleep(SETTLE_S)
        assert policy_generation(gateway) == 1.0
    finally:
        site.release()
        caller.join(30)
    assert len(outcome) == 1
    assert outcome[0].status_code == 200, outcome[0].text


def test_readiness_says_when_the_policy_file_is_gone(gateway_factory: GatewayFactory) -> None:
    gateway = gateway_factory(policy_document())
    status, body = gateway.readyz()
    assert (status, body["checks"]["policy_loaded"]) == (200, True)
    text = gateway.policy_path.read_text()
    gateway.policy_path.unlink()
    status, body = gateway.readyz()
    assert (status, body["checks"]["policy_loaded"]) == (503, False)
    assert "is gone" in str(body)
    gateway.policy_path.write_text(text)
    status, _ = gateway.readyz()
    assert status == 200
