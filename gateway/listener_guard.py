"""Connection budgets and deadlines for the aiohttp listeners (tools API, admin).

Owns what keeps one listener from exhausting the process: a cap on concurrent connections per
listener (over it, a new connection is closed at once, before any byte is read), the head
deadline and keep-alive idle time (aiohttp closes a connection whose request head is not complete
in time, which drops idle and slowloris clients), and the process's open-files limit, raised to
the hard limit at start and reported as a metric. Budgets are sized from that limit so the
listeners together stay below it and the proxy keeps its share. Never reads a request.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_server import Server

from gateway.observe import metrics

log = logging.getLogger("egress_gateway")

API_MAX_CONNECTIONS = 1024
ADMIN_MAX_CONNECTIONS = 64
# Shares of the open-files limit: the API may hold a quarter, the admin listener 1/32; the rest
# (more than two thirds) stays for the proxy, its upstream sockets, DNS and files.
API_SHARE_DIVISOR = 4
ADMIN_SHARE_DIVISOR = 32
MIN_CONNECTIONS = 8
FALLBACK_NOFILE = 1024


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    name: str
    max_connections: int
    head_timeout_s: float


def raise_open_files_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard limit; the soft limit now in force."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return FALLBACK_NOFILE
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
    limit = soft if soft != resource.RLIM_INFINITY else 1_048_576
    metrics.OPEN_FILES_LIMIT.set(limit)
    return int(limit)


def listener_limits(open_files: int, head_timeout_s: float) -> tuple[ListenerLimits, ListenerLimits]:
    """(api, admin) budgets for a process allowed `open_files` descriptors."""
    api = max(MIN_CONNECTIONS, min(API_MAX_CONNECTIONS, open_files // API_SHARE_DIVISOR))
    admin = max(MIN_CONNECTIONS, min(ADMIN_MAX_CONNECTIONS, open_files // ADMIN_SHARE_DIVISOR))
    return ListenerLimits("api", api, head_timeout_s), ListenerLimits("admin", admin, head_timeout_s)


class _OverBudget(asyncio.Protocol):
    """A connection past the listener's cap: closed before reading, so it costs a moment's fd."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class GuardedSite(web.BaseSite):
    """A TCP site whose protocol factory enforces the listener's connection cap."""

    __slots__ = ("_host", "_limits", "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limits: ListenerLimits) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._limits = limits

    @property
    def name(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    def _factory(self, server: Server) -> Callable[[], asyncio.BaseProtocol]:
        limits = self._limits
        refused = metrics.LISTENER_REFUSED.labels(listener=limits.name)

        def protocol() -> asyncio.BaseProtocol:
            if len(server.connections) >= limits.max_connections:
                refused.inc()
                return _OverBudget()
            return server()

        return protocol

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._factory(server), self._host, self._port, backlog=self._backlog, reuse_address=True
        )


async def serve_guarded(
    app: web.Application, host: str, port: int, limits: ListenerLimits, *, shutdown_timeout_s: float
) -> web.AppRunner:
    # keepalive_timeout is armed at accept and after each response: a head that is not complete
    # by then (slowloris) or an idle keep-alive connection is closed.
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=limits.head_timeout_s,
        shutdown_timeout=shutdown_timeout_s,
    )
    await runner.setup()
    await GuardedSite(runner, host, port, limits).start()
    return runner
