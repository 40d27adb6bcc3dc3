"""The client recipe table (README, docs/guides/forward-proxy.md) holds: each client, given only
the proxy variables (or the switch the table names), goes through the gateway or not as it says.

Each probe asks for a name of its own under the harness DNS, so the gateway's audit log shows
which probes came through it: a decision line for that name. A client that ignores the variables
tries the name on the machine's own resolver instead, where it does not exist, and leaves no
line. The clients are the real ones (curl, pip, npm, git, node, and requests, httpx and aiohttp in
a fresh interpreter each), with the harness CA passed the way each reads it. apt is not run: it
needs root and the machine's package sources, and reads the same `Acquire::*::Proxy` lines any
apt does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from tests.harness.certs import TestPKI
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import Origin, OriginFactory

pytestmark = pytest.mark.slow

GatewayFactory = Callable[..., GatewayProcess]
CLIENT_TIMEOUT_S = 60
TLS_NAMES = (
    "curl.recipes.example.org",
    "pip.recipes.example.org",
    "npm.recipes.example.org",
    "git.recipes.example.org",
    "node.recipes.example.org",
    "node-env-proxy.recipes.example.org",
    "requests.recipes.example.org",
    "httpx.recipes.example.org",
    "aiohttp.recipes.example.org",
    "aiohttp-trust-env.recipes.example.org",
)
PLAIN_NAMES = ("curl-upper.recipes.example.org", "curl-lower.recipes.example.org")


def _app() -> web.Application:
    async def anything(request: web.Request) -> web.Response:
        # pip, npm and git get a 404 for their package or repository: the request reached the
        # origin through the gateway, which is all the probe asks.
        status = 200 if request.path == "/" else 404
        return web.Response(text="recipe origin\n", status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    return app


@dataclass(frozen=True, slots=True)
class Setup:
    gateway: GatewayProcess
    tls: Origin
    plain: Origin
    ca: Path
    home: Path


@pytest.fixture
def setup(origins: OriginFactory, gateway_factory: GatewayFactory, pki: TestPKI, tmp_path: Path) -> Setup:
    tls = origins.start(_app(), TLS_NAMES, tls=True)
    plain = origins.start(_app(), PLAIN_NAMES, tls=False)
    policy = policy_document(allow_cidrs=[tls.cidr, plain.cidr], ports=[tls.port, plain.port])
    gateway = gateway_factory(policy)
    home = tmp_path / "home"
    home.mkdir()
    return Setup(gateway, tls, plain, pki.ca_path, home)


def run_client(setup: Setup, argv: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {"PATH": os.environ.get("PATH", ""), "HOME": str(setup.home), **env}
    return subprocess.run(
        argv,
        env=clean,
        cwd=setup.home,
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
        check=False,
    )


def came_through(setup: Setup, name: str) -> bool:
    lines = setup.gateway.wait_audit(lambda lines: any(line.get("host") == name for line in lines), timeout_s=2.0)
    return any(line.get("host") == name and line.get("event") == "decision" for line in lines)


def proxy_env(setup: Setup, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, setup.gateway.proxy_url)


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (make system-deps installs the clients)", pytrace=False)
    return path


def python_client(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_curl_reads_https_proxy_and_only_the_lower_case_http_proxy(setup: Setup) -> None:
    url = setup.tls.url("/", "curl.recipes.example.org")
    run_client(setup, [tool("curl"), "-sS", "--cacert", str(setup.ca), url], proxy_env(setup, "HTTPS_PROXY"))
    assert came_through(setup, "curl.recipes.example.org")

    upper = setup.plain.url("/", "curl-upper.recipes.example.org")
    run_client(setup, [tool("curl"), "-sS", "--max-time", "10", upper], proxy_env(setup, "HTTP_PROXY"))
    assert not came_through(setup, "curl-upper.recipes.example.org")

    lower = setup.plain.url("/", "curl-lower.recipes.example.org")
    result = run_client(setup, [tool("curl"), "-sS", lower], proxy_env(setup, "http_proxy"))
    assert result.stdout == "recipe origin\n"
    assert came_through(setup, "curl-lower.recipes.example.org")


def test_pip_npm_and_git_read_https_proxy(setup: Setup) -> None:
    index = setup.tls.url("/simple/", "pip.recipes.example.org")
    run_client(
        setup,
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-cache-dir",
            "--retries",
            "0",
            "--cert",
            str(setup.ca),
            "--index-url",
            index,
            "-d",
            "dl",
            "nothing-here",
        ],
        proxy_env(setup, "HTTPS_PROXY"),
    )
    assert came_through(setup, "pip.recipes.example.org")

    registry = setup.tls.url("/", "npm.recipes.example.org")
    run_client(
        setup,
        [tool("npm"), "view", "nothing-here", "--registry", registry, "--fetch-retries", "0"],
        {**proxy_env(setup, "HTTPS_PROXY"), "NODE_EXTRA_CA_CERTS": str(setup.ca)},
    )
    assert came_through(setup, "npm.recipes.example.org")

    repository = setup.tls.url("/repo.git", "git.recipes.example.org")
    run_client(
        setup,
        [tool("git"), "ls-remote", repository],
        {**proxy_env(setup, "https_proxy"), "GIT_SSL_CAINFO": str(setup.ca), "GIT_TERMINAL_PROMPT": "0"},
    )
    assert came_through(setup, "git.recipes.example.org")


def node_reads_env_proxy_with_the_switch() -> bool:
    """NODE_USE_ENV_PROXY arrived in Node 24 and was backported to 22.21."""
    version = subprocess.run(
        [tool("node"), "-p", "process.versions.node"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()
    major, minor = (int(part) for part in version.split(".")[:2])
    return major >= 24 or (major == 22 and minor >= 21)


def test_node_fetch_ignores_https_proxy_unless_node_use_env_proxy_is_set_on_a_node_that_has_it(
    setup: Setup,
) -> None:
    script = "fetch(process.argv[1]).then(r => r.text()).then(console.log, e => console.log(String(e)))"
    env = {**proxy_env(setup, "HTTPS_PROXY"), "NODE_EXTRA_CA_CERTS": str(setup.ca)}
    run_client(setup, [tool("node"), "-e", script, setup.tls.url("/", "node.recipes.example.org")], env)
    assert not came_through(setup, "node.recipes.example.org")

    env["NODE_USE_ENV_PROXY"] = "1"
    url = setup.tls.url("/", "node-env-proxy.recipes.example.org")
    run_client(setup, [tool("node"), "-e", script, url], env)
    assert came_through(setup, "node-env-proxy.recipes.example.org") == node_reads_env_proxy_with_the_switch()


def test_requests_and_httpx_read_the_variables_and_aiohttp_only_with_trust_env(setup: Setup) -> None:
    env = {**proxy_env(setup, "HTTPS_PROXY"), "REQUESTS_CA_BUNDLE": str(setup.ca), "SSL_CERT_FILE": str(setup.ca)}
    requests_url = setup.tls.url("/", "requests.recipes.example.org")
    run_client(setup, python_client(f"import requests; print(requests.get({requests_url!r}, timeout=10).text)"), env)
    assert came_through(setup, "requests.recipes.example.org")

    httpx_url = setup.tls.url("/", "httpx.recipes.example.org")
    code = f"import httpx; print(httpx.get({httpx_url!r}, verify={str(setup.ca)!r}, timeout=10).text)"
    run_client(setup, python_client(code), env)
    assert came_through(setup, "httpx.recipes.example.org")

    aiohttp_code = """
import asyncio, ssl, sys
import aiohttp

async def main(url, trust_env):
    context = ssl.create_default_context(cafile=sys.argv[2])
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(trust_env=trust_env, timeout=timeout) as session:
        try:
            async with session.get(url, ssl=context) as response:
                print(await response.text())
        except aiohttp.ClientError as exc:
            print(exc)

asyncio.run(main(sys.argv[1], sys.argv[3] == "trust"))
"""
    for name, switch in (
        ("aiohttp.recipes.example.org", "default"),
        ("aiohttp-trust-env.recipes.example.org", "trust"),
    ):
        argv = [*python_client(aiohttp_code), setup.tls.url("/", name), str(setup.ca), switch]
        run_client(setup, argv, env)
    assert not came_through(setup, "aiohttp.recipes.example.org")
    assert came_through(setup, "aiohttp-trust-env.recipes.example.org")
