"""A smart-HTTP git origin for the inspection tests: `git http-backend` behind a small CGI handler
in an aiohttp app, over a bare repository the test made. Push is enabled on the server, so a
push refused through the gateway is the gateway's refusal, not the server's. No tests here."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

from aiohttp import web

HTTP_BACKEND = Path(subprocess.run(["git", "--exec-path"], capture_output=True, text=True, check=True).stdout.strip())
CGI_TIMEOUT_S = 30.0


def make_bare_repository(root: Path, name: str = "tools.git") -> Path:
    """A bare repository with one commit, pushable over HTTP (http.receivepack)."""
    work = root / "seed"
    bare = root / name
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True, env=env)
    (work / "README").write_text("seed\n")
    subprocess.run(["git", "-C", str(work), "add", "README"], check=True, env=env)
    subprocess.run(["git", "-C", str(work), "commit", "-q", "-m", "seed"], check=True, env=env)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, env=env)
    subprocess.run(["git", "-C", str(bare), "config", "http.receivepack", "true"], check=True, env=env)
    return bare


def git_http_app(project_root: Path, seen: list[str]) -> web.Application:
    """Every request becomes one `git http-backend` run (RFC 3875 variables, body on stdin)."""

    async def cgi(request: web.Request) -> web.StreamResponse:
        seen.append(f"{request.method} {request.path}")
        body = await request.read()
        env = {
            "PATH": os.environ.get("PATH", ""),
            "GIT_PROJECT_ROOT": str(project_root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": request.method,
            "PATH_INFO": request.path,
            "QUERY_STRING": request.query_string,
            "CONTENT_TYPE": request.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": "tester",
            "REMOTE_ADDR": request.remote or "127.0.0.1",
        }
        if "Content-Encoding" in request.headers:
            env["HTTP_CONTENT_ENCODING"] = request.headers["Content-Encoding"]
        if "Git-Protocol" in request.headers:
            env["HTTP_GIT_PROTOCOL"] = request.headers["Git-Protocol"]
        process = await asyncio.create_subprocess_exec(
            str(HTTP_BACKEND / "git-http-backend"),
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        output, _ = await asyncio.wait_for(process.communicate(body), CGI_TIMEOUT_S)
        head, _, payload = output.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = output.partition(b"\n\n")
        status = 200
        headers: dict[str, str] = {}
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers[name.strip()] = value.strip()
        return web.Response(status=status, body=payload, headers=headers)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", cgi)
    return app
