"""The admin listener: /healthz (the loop answers), /readyz (the proxy may take traffic),
/readyz/tools (the tools' budget store answers too), /metrics."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.observe.metrics import REGISTRY

Readiness = Callable[[], tuple[bool, dict[str, bool]]]


def build_admin_app(
    readiness: Readiness,
    *,
    tools_readiness: Readiness | None = None,
    reasons: Callable[[], dict[str, str]] | None = None,
) -> web.Application:
    """`readiness` returns (ready, checks); checks name what is not ready and `reasons` say why."""

    def answer(check: Readiness) -> web.Response:
        ready, checks = check()
        body: dict[str, object] = {"ready": ready, "checks": checks}
        why = reasons() if reasons is not None else {}
        if why:
            body["reasons"] = {name: text for name, text in why.items() if name in checks}
        return web.json_response(body, status=200 if ready else 503)

    async def healthz(_: web.Request) -> web.Response:
        # Answering at all proves the event loop is alive; liveness must not depend on upstreams.
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        return answer(readiness)

    async def readyz_tools(_: web.Request) -> web.Response:
        return answer(tools_readiness or readiness)

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(REGISTRY)
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def plain_server_header(_: web.Request, response: web.StreamResponse) -> None:
        # No "Python/3.x aiohttp/3.y" banner: the connection budget and deadlines live in listener_guard.
        response.headers["Server"] = "egress-gateway"

    app = web.Application()
    app.on_response_prepare.append(plain_server_header)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/readyz/tools", readyz_tools)
    app.router.add_get("/metrics", metrics)
    return app
