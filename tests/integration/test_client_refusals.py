"""What real package clients print when the gateway refuses them (issue 29): npm, pip and curl,
their real CLIs through the proxy, with the registries served by a harness origin.

One TLS origin answers as an npm registry and a PyPI simple index under names the policy allows;
the same clients pointed at a name the policy refuses must print the host and the code, and
npm must print the reason instead of `[object Object]`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from aiohttp import web

from tests.conftest import GatewayFactory
from tests.harness.certs import TestPKI
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import Origin, OriginFactory

NPM_HOST = "registry.npm-test.example"
PYPI_HOST = "pypi.pip-test.example"
DENIED_HOST = "registry.denied-test.example"
MISSING_HOST = "missing.npm-test.example"  # allowed, but the fake DNS has no such name
PACKAGE = "demo-pkg"
CLIENT_TIMEOUT_S = 60


def _tarball() -> bytes:
    manifest = json.dumps({"name": PACKAGE, "version": "1.0.0"}).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("package/package.json")
        info.size = len(manifest)
        archive.addfile(info, io.BytesIO(manifest))
    return buffer.getvalue()


WHEEL_NAME = "demo_pkg-1.0.0-py3-none-any.whl"


def _wheel() -> bytes:
    """The smallest wheel pip accepts: METADATA, WHEEL and RECORD."""
    info = "demo_pkg-1.0.0.dist-info"
    files = {
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in {**files, f"{info}/RECORD": record}.items():
            archive.writestr(name, text)
    return buffer.getvalue()


def _registry_app(origin_port: list[int]) -> web.Application:
    """An npm registry (packument and tarball) and a PyPI simple index with one wheel."""
    tarball, wheel = _tarball(), _wheel()

    async def packument(request: web.Request) -> web.Response:
        base = f"https://{request.host.split(':')[0]}:{origin_port[0]}"
        version = {
            "name": PACKAGE,
            "version": "1.0.0",
            "dist": {
                "tarball": f"{base}/{PACKAGE}/-/{PACKAGE}-1.0.0.tgz",
                "shasum": hashlib.sha1(tarball).hexdigest(),  # npm's packument field
            },
        }
        document = {"name": PACKAGE, "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": version}}
        return web.json_response(document)

    async def npm_tarball(request: web.Request) -> web.Response:
        return web.Response(body=tarball, content_type="application/octet-stream")

    async def simple(request: web.Request) -> web.Response:
        digest = hashlib.sha256(wheel).hexdigest()
        link = f'<a href="/files/{WHEEL_NAME}#sha256={digest}">{WHEEL_NAME}</a>'
        return web.Response(text=f"<html><body>{link}</body></html>", content_type="text/html")

    async def wheel_file(request: web.Request) -> web.Response:
        return web.Response(body=wheel, content_type="application/octet-stream")

    app = web.Application()
    app.router.add_get(f"/{PACKAGE}", packument)
    app.router.add_get(f"/{PACKAGE}/-/{{name}}", npm_tarball)
    app.router.add_get(f"/simple/{PACKAGE}/", simple)
    app.router.add_get("/files/{name}", wheel_file)
    return app


@pytest.fixture
def registry(origins: OriginFactory) -> Origin:
    port: list[int] = []
    origin = origins.start(_registry_app(port), names=(NPM_HOST, PYPI_HOST, DENIED_HOST), tls=True)
    port.append(origin.port)
    return origin


@pytest.fixture
def gateway(gateway_factory: GatewayFactory, registry: Origin) -> GatewayProcess:
    principals = {"default": {"egress": {"allow_domains": [NPM_HOST, PYPI_HOST, MISSING_HOST]}}}
    policy = policy_document(allow_cidrs=[registry.cidr], ports=[443, registry.port], principals=principals)
    return gateway_factory(policy)


def _client_env(gateway: GatewayProcess, pki: TestPKI, home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "HTTPS_PROXY": gateway.proxy_url,
        "HTTP_PROXY": gateway.proxy_url,
        "https_proxy": gateway.proxy_url,
        "http_proxy": gateway.proxy_url,
        "NO_PROXY": "",
        "NODE_EXTRA_CA_CERTS": str(pki.ca_path),
        "npm_config_cafile": str(pki.ca_path),
        "npm_config_cache": str(home / "npm-cache"),
        "npm_config_update_notifier": "false",
        "npm_config_fetch_retries": "0",
        "npm_config_audit": "false",
        "npm_config_fund": "false",
        "PIP_CERT": str(pki.ca_path),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_RETRIES": "1",
        "PIP_TIMEOUT": "10",
        "PIP_NO_CACHE_DIR": "1",
    }


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=CLIENT_TIMEOUT_S, check=False)


def _npm(gateway: GatewayProcess, pki: TestPKI, home: Path, host: str, port: int) -> subprocess.CompletedProcess[str]:
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is not installed (scripts/install-system-deps.sh installs it)")
    argv = [npm, "view", PACKAGE, "version", "--registry", f"https://{host}:{port}/"]
    return _run(argv, _client_env(gateway, pki, home), home)


def _pip(gateway: GatewayProcess, pki: TestPKI, home: Path, host: str, port: int) -> subprocess.CompletedProcess[str]:
    index = f"https://{host}:{port}/simple/"
    argv = [sys.executable, "-m", "pip", "download", PACKAGE, "--no-deps", "--only-binary", ":all:"]
    argv += ["-d", str(home / "dl"), "--index-url", index, "--proxy", gateway.proxy_url]
    return _run(argv, _client_env(gateway, pki, home), home)


def _curl(gateway: GatewayProcess, pki: TestPKI, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = ["curl", "-sS", "--max-time", "10", "-x", gateway.proxy_url, "--cacert", str(pki.ca_path), *args]
    return _run(argv, _client_env(gateway, pki, home), home)


def test_npm_and_pip_work_through_the_gateway_when_allowed(
    gateway: GatewayProcess, registry: Origin, pki: TestPKI, tmp_path: Path
) -> None:
    npm = _npm(gateway, pki, tmp_path, NPM_HOST, registry.port)
    assert npm.returncode == 0, npm.stdout + npm.stderr
    assert npm.stdout.strip() == "1.0.0"
    pip = _pip(gateway, pki, tmp_path, PYPI_HOST, registry.port)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert (tmp_path / "dl" / WHEEL_NAME).exists()


REASON = f"{DENIED_HOST} is not in default's allow_domains"


def test_npm_prints_the_status_line_and_the_reason_not_object_object(
    gateway: GatewayProcess, registry: Origin, pki: TestPKI, tmp_path: Path
) -> None:
    result = _npm(gateway, pki, tmp_path, DENIED_HOST, registry.port)
    assert result.returncode != 0
    printed = result.stdout + result.stderr
    assert "[object Object]" not in printed
    status = f"403 Forbidden (egress: policy_denied {DENIED_HOST}:{registry.port})"
    [line] = [line for line in printed.splitlines() if status in line]
    # npm's own words around ours: "npm error 403 <status line> - GET <url> - <body.error>".
    assert line.endswith(f" - policy_denied: {REASON} (this principal may not reach that host or port: ask the "
                         "operator to add it to the principal's egress.allow_domains (or defaults.ports) in the "
                         "gateway policy)")  # fmt: skip


def test_pip_prints_the_status_line_with_the_host(
    gateway: GatewayProcess, registry: Origin, pki: TestPKI, tmp_path: Path
) -> None:
    result = _pip(gateway, pki, tmp_path, DENIED_HOST, registry.port)
    assert result.returncode != 0
    status = f"Tunnel connection failed: 403 Forbidden (egress: policy_denied {DENIED_HOST}:{registry.port})"
    assert status in result.stdout + result.stderr


def test_curl_prints_the_body_for_plain_http_and_the_status_line_with_v(
    gateway: GatewayProcess, registry: Origin, pki: TestPKI, tmp_path: Path
) -> None:
    plain = _curl(gateway, pki, tmp_path, f"http://{DENIED_HOST}:{registry.port}/{PACKAGE}")
    assert plain.returncode == 0  # curl without --fail: the refusal is the response
    body = json.loads(plain.stdout)
    assert body["error"] == body["message"]
    assert body["error"].startswith(f"policy_denied: {REASON} (")
    assert body["egress"]["code"] == "policy_denied"
    assert body["egress"]["retryable"] is False
    assert body["egress"]["destination"] == f"{DENIED_HOST}:{registry.port}"
    # Through CONNECT curl says only "response 403"; -v shows the status line, without the
    # default port: a CONNECT to 443 is refused before any lookup.
    tunnel = _curl(gateway, pki, tmp_path, f"https://{DENIED_HOST}:{registry.port}/")
    assert tunnel.returncode == 56
    assert "CONNECT tunnel failed, response 403" in tunnel.stderr
    verbose = _curl(gateway, pki, tmp_path, "-v", f"https://{DENIED_HOST}/")
    assert f"< HTTP/1.1 403 Forbidden (egress: policy_denied {DENIED_HOST})" in verbose.stderr


def test_a_name_that_does_not_exist_is_named_and_not_to_be_retried(
    gateway: GatewayProcess, registry: Origin, pki: TestPKI, tmp_path: Path
) -> None:
    verbose = _curl(gateway, pki, tmp_path, "-v", f"https://{MISSING_HOST}:{registry.port}/")
    assert f"< HTTP/1.1 502 Bad Gateway (egress: dns_failure {MISSING_HOST}:{registry.port})" in verbose.stderr
    plain = _curl(gateway, pki, tmp_path, f"http://{MISSING_HOST}:{registry.port}/")
    body = json.loads(plain.stdout)
    assert body["egress"]["code"] == "dns_failure"
    assert "NXDOMAIN" in body["egress"]["message"]
    assert body["egress"]["retryable"] is False
    assert "check the host name" in body["error"]
