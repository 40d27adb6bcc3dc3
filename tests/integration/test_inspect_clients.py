"""Real tools through inspected HTTPS (issue 25), each trusting the interception CA only through
its environment variable: git clone and fetch allowed by a read-only rule set and push refused,
against `git http-backend`; pip installing from a harness index, and refused where a rule says."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from aiohttp import web

from tests.harness.git_origin import git_http_app, make_bare_repository
from tests.harness.inspection import InspectingGatewayFactory, InterceptionCA, inspect_policy
from tests.harness.origins import OriginFactory

GIT_HOST = "git.example.org"
INDEX_HOST = "pypi.example.org"
READ_ONLY_GIT = {
    "allow": [
        {"id": "git-refs", "methods": ["GET"], "paths": ["/**/info/refs"], "query": {"service": "git-upload-pack"}},
        {"id": "git-fetch", "methods": ["POST"], "paths": ["/**/git-upload-pack"]},
    ],
    "deny": [{"id": "git-push", "paths": ["/**/git-receive-pack"]}],
}


def _git(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_git_clone_and_fetch_pass_a_read_only_rule_set_and_push_is_refused(
    inspecting_gateway: InspectingGatewayFactory,
    interception_ca: InterceptionCA,
    origins: OriginFactory,
    tmp_path: Path,
) -> None:
    bare = make_bare_repository(tmp_path / "server")
    seen: list[str] = []
    origin = origins.start(git_http_app(bare.parent, seen), names=(GIT_HOST,))
    gateway = inspecting_gateway(inspect_policy(origin, READ_ONLY_GIT))
    env = {
        **interception_ca.agent_env(gateway.proxy_url),
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "agent",
        "GIT_AUTHOR_EMAIL": "agent@example.org",
        "GIT_COMMITTER_NAME": "agent",
        "GIT_COMMITTER_EMAIL": "agent@example.org",
    }
    url = f"https://{GIT_HOST}:{origin.port}/tools.git"
    clone = tmp_path / "clone"
    cloned = _git(env, "clone", "-q", url, str(clone))
    assert cloned.returncode == 0, cloned.stderr
    assert (clone / "README").read_text() == "seed\n"
    fetched = _git(env, "fetch", "-q", "origin", cwd=clone)
    assert fetched.returncode == 0, fetched.stderr
    (clone / "NEW").write_text("agent change\n")
    _git(env, "add", "NEW", cwd=clone)
    _git(env, "commit", "-q", "-m", "change", cwd=clone)
    pushed = _git(env, "push", "-q", "origin", "main", cwd=clone)
    assert pushed.returncode != 0
    assert "403" in pushed.stderr
    assert not [request for request in seen if "receive-pack" in request]  # never reached the server
    heads = subprocess.run(["git", "-C", str(bare), "log", "--oneline"], capture_output=True, text=True, check=True)
    assert len(heads.stdout.splitlines()) == 1
    lines = gateway.wait_audit(lambda ls: any(x.get("kind") == "inspect" and x.get("decision") == "deny" for x in ls))
    inspect = [line for line in lines if line.get("kind") == "inspect"]
    allowed = {
        (line["method"], line["path"].rsplit("/", 2)[-2:][-1], line["rule"])
        for line in inspect
        if line["decision"] == "allow"
    }
    assert ("GET", "refs", "git-refs") in allowed
    assert ("POST", "git-upload-pack", "git-fetch") in allowed
    denied = [line for line in inspect if line["decision"] == "deny"]
    assert denied
    assert all(line["path"] == "/tools.git/info/refs" for line in denied)
    assert denied[0]["rule"] == "inspect[0].default_deny"  # the receive-pack service's refs


def _wheel(name: str, version: str) -> tuple[str, bytes]:
    """A minimal pure-Python wheel (PEP 427) holding one module."""
    filename = f"{name}-{version}-py3-none-any.whl"
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = (
        "".join(f"{path},sha256={_digest(data)},{len(data)}\n" for path, data in files.items()) + f"{dist}/RECORD,,\n"
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr(f"{dist}/RECORD", record)
    return filename, buffer.getvalue()


def _digest(data: bytes) -> str:
    import base64  # noqa: PLC0415

    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _index_app(packages: dict[str, tuple[str, bytes]]) -> web.Application:
    async def project(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in packages:
            raise web.HTTPNotFound()
        filename, data = packages[name]
        link = f'<a href="/files/{filename}#sha256={hashlib.sha256(data).hexdigest()}">{filename}</a>'
        return web.Response(text=f"<html><body>{link}</body></html>", content_type="text/html")

    async def file(request: web.Request) -> web.Response:
        for filename, data in packages.values():
            if filename == request.match_info["filename"]:
                return web.Response(body=data, content_type="application/octet-stream")
        raise web.HTTPNotFound()

    app = web.Application()
    app.router.add_get("/simple/{name}/", project)
    app.router.add_get("/files/{filename}", file)
    return app


def test_pip_installs_from_an_inspected_index_and_a_rule_refuses_a_project(
    inspecting_gateway: InspectingGatewayFactory,
    interception_ca: InterceptionCA,
    origins: OriginFactory,
    tmp_path: Path,
) -> None:
    packages = {name: _wheel(name, "1.0") for name in ("tinypkg", "blockedpkg")}
    origin = origins.start(_index_app(packages), names=(INDEX_HOST,))
    entry = {"access": "read-only", "deny": [{"id": "no-blockedpkg", "paths": ["/simple/blockedpkg/**"]}]}
    gateway = inspecting_gateway(inspect_policy(origin, entry))
    env = {
        **interception_ca.agent_env(gateway.proxy_url),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_CONFIG_FILE": os.devnull,
    }
    index = f"https://{INDEX_HOST}:{origin.port}/simple"
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--index-url", index, "-d", str(tmp_path / "dl")]
    got = subprocess.run([*base, "tinypkg"], env=env, capture_output=True, text=True, timeout=90, check=False)
    assert got.returncode == 0, got.stdout + got.stderr
    assert (tmp_path / "dl" / "tinypkg-1.0-py3-none-any.whl").exists()
    refused = subprocess.run([*base, "blockedpkg"], env=env, capture_output=True, text=True, timeout=90, check=False)
    assert refused.returncode != 0
    assert not (tmp_path / "dl" / "blockedpkg-1.0-py3-none-any.whl").exists()
    lines = gateway.wait_audit(lambda ls: any(x.get("rule") == "no-blockedpkg" for x in ls))
    inspect = [line for line in lines if line.get("kind") == "inspect"]
    assert ("/simple/tinypkg/", 200) in {(line["path"], line.get("status")) for line in inspect}
    assert any(line["rule"] == "no-blockedpkg" and line["decision"] == "deny" for line in inspect)
