"""Learn mode over inspected HTTPS: the real daemon terminates TLS for an inspected host, curl
(trusting the interception CA through its environment) makes requests, the `kind: inspect`
audit lines carry each method and path, `policy suggest --base` turns them into allow rules
with path prefixes, and the suggestion, enforced, passes what was seen and refuses the rest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from tests.harness.inspection import API, InspectingGateway, InspectingGatewayFactory, InterceptionCA, inspect_policy
from tests.harness.origins import Origin, OriginFactory

SUGGEST = (sys.executable, "-m", "gateway", "policy", "suggest")


def _app() -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"method": request.method, "path": request.path})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


def _base(origin: Origin) -> dict[str, Any]:
    rules = {"access": "read-write", "deny": [{"id": "no-admin", "paths": ["/admin/**"]}]}
    return inspect_policy(origin, rules, allow_domains=[API])


@pytest.fixture
def api_origin(origins: OriginFactory) -> Origin:
    return origins.start(_app(), names=(API,))


def _status(ca: InterceptionCA, gateway: InspectingGateway, method: str, url: str) -> str:
    result = subprocess.run(
        ["curl", "-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}", "-X", method, url],
        env=ca.agent_env(gateway.proxy_url),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    return result.stdout


def test_inspected_requests_become_methods_and_path_prefixes_that_enforce(
    inspecting_gateway: InspectingGatewayFactory, interception_ca: InterceptionCA, api_origin: Origin, tmp_path: Path
) -> None:
    base = _base(api_origin)
    observing = inspecting_gateway(base)
    url = f"https://{API}:{api_origin.port}"
    seen = [("GET", "/repos/myorg/tools"), ("GET", "/repos/myorg/site/pulls"), ("POST", "/repos/myorg/tools/issues")]
    for method, path in seen:
        assert _status(interception_ca, observing, method, url + path) == "200"
    assert _status(interception_ca, observing, "GET", url + "/admin/users") == "403"
    observing.wait_audit(lambda lines: sum(line.get("kind") == "inspect" for line in lines) >= 4)
    observing.stop()

    base_path = tmp_path / "base.yaml"
    base_path.write_text(yaml.safe_dump(base, sort_keys=False))
    suggested_path = tmp_path / "suggested.yaml"
    result = subprocess.run(
        [*SUGGEST, "--from", str(observing.audit_path), "--base", str(base_path), "-o", str(suggested_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    suggested = yaml.safe_load(suggested_path.read_text())
    [entry] = suggested["principals"]["default"]["inspect"]
    assert entry == {
        "host": API,
        "ports": [api_origin.port],
        "deny": [{"id": "no-admin", "paths": ["/admin/**"]}],
        "allow": [
            {"methods": ["GET"], "paths": ["/repos/myorg/**"]},
            {"methods": ["POST"], "paths": ["/repos/myorg/tools/issues"]},
        ],
    }
    assert f"default  {API}:{api_origin.port}  policy_denied" in result.stdout  # the /admin refusal, listed

    enforcing = inspecting_gateway(suggested)
    assert _status(interception_ca, enforcing, "GET", url + "/repos/myorg/another") == "200"
    assert _status(interception_ca, enforcing, "POST", url + "/repos/myorg/tools/issues") == "200"
    # What the preset allowed but the agent never did is closed now.
    assert _status(interception_ca, enforcing, "GET", url + "/search/code") == "403"
    assert _status(interception_ca, enforcing, "DELETE", url + "/repos/myorg/tools") == "403"
