"""The test orchestrator: its credential for the policy, and run tokens for the gateways' secret.

Tests that need budgets keyed by run and step ids give every gateway `SECRET_ENV` and the policy
`TEST_ORCHESTRATORS`. `run_token()` signs a token locally, as an orchestrator that holds the
gateways' secret could; `mint()` asks a running gateway's `POST /v1/runs` with the orchestrator's
bearer token, as docs/concepts/budgets.md tells orchestrators to.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import Any

import httpx

from gateway.budget.run_token import RunClaims, mint_run_token

RUN_TOKEN_SECRET = "test-run-token-secret-0123456789abcdef"
SECRET_ENV = {"EGRESS_RUN_TOKEN_SECRET": RUN_TOKEN_SECRET}
ORCHESTRATOR_NAME = "test-orchestrator"
ORCHESTRATOR_TOKEN = "orchestrator-token-for-the-test-suite"
TEST_ORCHESTRATORS: dict[str, Any] = {
    ORCHESTRATOR_NAME: {
        "token_sha256": hashlib.sha256(ORCHESTRATOR_TOKEN.encode()).hexdigest(),
        "principals": ["*"],
    }
}


def run_token(
    run_id: str,
    *,
    principal: str = "default",
    step_id: str | None = None,
    ttl_s: float = 3600,
    limits: Mapping[str, Mapping[str, int]] | None = None,
    secret: str = RUN_TOKEN_SECRET,
    orchestrator: str = ORCHESTRATOR_NAME,
) -> str:
    claims = RunClaims(
        orchestrator=orchestrator,
        principal=principal,
        run_id=run_id,
        expires_at=int(time.time() + ttl_s),
        step_id=step_id,
        limits={tool: dict(values) for tool, values in (limits or {}).items()},
    )
    return mint_run_token(secret.encode(), claims)


def mint(api_url: str, body: Mapping[str, Any], token: str = ORCHESTRATOR_TOKEN) -> httpx.Response:
    return httpx.post(f"{api_url}/v1/runs", json=dict(body), headers={"Authorization": f"Bearer {token}"}, timeout=10)
