"""`check`, /v1/fetch and the proxy give one verdict and one code for the same URL (issue 11).

A table of URLs goes through the real CLI (`python -m gateway check`), the real daemon's
/v1/fetch, and the same daemon's proxy driven by curl; the verdicts and codes are compared.
The proxy column is left out only where it cannot see what decides: a CONNECT tunnel never sees
the query string, so a secret query parameter is the tools' rule alone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
from aiohttp import web

from tests.conftest import GatewayFactory
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import OriginFactory

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = "allowed"
_PROXY_CODE = re.compile(r"^< X-Egress-Code: (\S+)", re.MULTILINE | re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    url: str
    expected: str  # "allowed" or the code every surface must give
    proxy_sees_it: bool = True


def page_app() -> web.Application:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<html><head><title>t</title></head><body><p>a page</p></body></html>",
                            content_type="text/html")  # fmt: skip

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    return app


def check_verdict(gateway: GatewayProcess, url: str) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("EGRESS_")}
    env = {**base, "EGRESS_POLICY": str(gateway.policy_path), "EGRESS_NAMESERVERS": gateway.env["EGRESS_NAMESERVERS"]}
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "check", url],
        check=False, capture_output=True, text=True, timeout=30, cwd=ROOT, env=env,
    )  # fmt: skip
    assert run.returncode in {0, 3}, run.stderr
    result = json.loads(run.stdout)
    return ALLOWED if result["allowed"] else str(result["code"])


def fetch_verdict(gateway: GatewayProcess, url: str) -> str:
    response = httpx.post(f"{gateway.api_url}/v1/fetch", json={"url": url}, timeout=30)
    return ALLOWED if response.status_code == 200 else str(response.json()["error"]["code"])


def proxy_verdict(gateway: GatewayProcess, url: str, pki: TestPKI) -> str:
    run = subprocess.run(
        ["curl", "-sS", "-v", "-o", "/dev/null", "--max-time", "20", "--cacert", str(pki.ca_path),
         "-x", gateway.proxy_url, url],
        check=False, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if run.returncode == 0:
        return ALLOWED
    match = _PROXY_CODE.search(run.stderr)
    assert match is not None, run.stderr
    return match.group(1)


def test_check_fetch_and_proxy_agree_on_every_url(
    gateway_factory: GatewayFactory, origins: OriginFactory, fake_dns: FakeDNS, pki: TestPKI
) -> None:
    origin = origins.start(page_app(), names=["docs.verdicts.example"])
    fake_dns.add("metadata-alias.verdicts.example", "169.254.169.254")
    fake_dns.add("mixed.verdicts.example", origin.ip, "10.0.0.7")
    principals = {
        "default": {
            "egress": {"allow_domains": ["*"], "deny_domains": ["*.blocked.example"]},
            "tools": {"fetch": True, "search": False},
        }
    }
    gateway = gateway_factory(
        policy_document(
            allow_cidrs=[origin.cidr], ports=[443, origin.port], principals=principals, fetch={"robots": "ignore"}
        )
    )
    base = f"https://docs.verdicts.example:{origin.port}"
    cases = [
        Case("allowed", f"{base}/page", ALLOWED),
        Case("secret-query-parameter", f"{base}/page?api_key=x", "unsafe_url", proxy_sees_it=False),
        Case("port-not-in-policy", "https://docs.verdicts.example:8443/", "unsafe_url"),
        Case("denied-domain", "https://www.blocked.example/", "policy_denied"),
        Case("name-resolving-to-metadata", "https://metadata-alias.verdicts.example/", "blocked_destination"),
        Case("public-and-private-answers", f"https://mixed.verdicts.example:{origin.port}/", "blocked_destination"),
        Case("literal-ip", "https://93.184.216.34/", "unsafe_url"),
        Case("internal-suffix", "https://metadata.google.internal/", "unsafe_url"),
        Case("nxdomain", "https://nowhere.verdicts.example/", "dns_failure"),
    ]  # fmt: skip
    table: dict[str, dict[str, str]] = {}
    for case in cases:
        row = {"check": check_verdict(gateway, case.url), "fetch": fetch_verdict(gateway, case.url)}
        if case.proxy_sees_it:
            row["proxy"] = proxy_verdict(gateway, case.url, pki)
        table[case.name] = row
    expected = {
        case.name: {surface: case.expected for surface in ("check", "fetch", "proxy") if surface in table[case.name]}
        for case in cases
    }
    assert table == expected


def test_an_in_cluster_name_opens_only_through_its_exact_internal_hosts_entry_everywhere(
    gateway_factory: GatewayFactory, origins: OriginFactory, fake_dns: FakeDNS, pki: TestPKI
) -> None:
    # issue 16: a self-hosted service in the cluster, named exactly with its CIDR, is reachable
    # on every surface; a sibling name under the same suffix stays refused on every surface.
    origin = origins.start(page_app(), names=["reader.tools.svc.cluster.local"])
    fake_dns.add("other.tools.svc.cluster.local", origin.ip)
    principals = {
        "default": {
            "egress": {
                "allow_domains": ["*"],
                "internal_hosts": [{"host": "reader.tools.svc.cluster.local", "cidrs": [origin.cidr]}],
            },
            "tools": {"fetch": True, "search": False},
        }
    }
    document = policy_document(ports=[443, origin.port], principals=principals, fetch={"robots": "ignore"})
    gateway = gateway_factory(document)
    lint = subprocess.run(
        [sys.executable, "-m", "gateway", "policy", "lint", str(gateway.policy_path)],
        check=False, capture_output=True, text=True, timeout=30, cwd=ROOT,
    )  # fmt: skip
    assert lint.returncode == 0, lint.stderr
    table = {}
    for name, expected in (("reader", ALLOWED), ("other", "unsafe_url")):
        url = f"https://{name}.tools.svc.cluster.local:{origin.port}/page"
        row = {
            "check": check_verdict(gateway, url),
            "fetch": fetch_verdict(gateway, url),
            "proxy": proxy_verdict(gateway, url, pki),
        }
        table[name] = (row, {surface: expected for surface in row})
    assert {name: got for name, (got, _) in table.items()} == {name: want for name, (_, want) in table.items()}
