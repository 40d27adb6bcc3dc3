"""The daemon: builds every component from Settings, binds the listeners, runs until SIGTERM.

Owns process-level wiring only: policy holder and its reload triggers (SIGHUP, file change),
the resolver, the egress core, the listeners, readiness, and the drain on SIGTERM. Each part's
behaviour lives in its own module.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal

from aiohttp import web

from gateway.budget import BudgetStore, open_store
from gateway.egress.client import GuardedClient
from gateway.egress.connect import build_ssl_context
from gateway.egress.resolver import Resolver
from gateway.egress.target import EgressCore
from gateway.observe import metrics
from gateway.observe.admin import build_admin_app
from gateway.observe.audit import AuditLog
from gateway.policy.holder import PolicyHolder
from gateway.proxy.server import ProxyServer
from gateway.settings import ListenAddress, Settings
from gateway.tasks import spawn
from gateway.tools.api import ToolsApi
from gateway.tools.call_guard import ToolCalls
from gateway.tools.extract.pool import ExtractionPool
from gateway.tools.fetch import FetchTool, ReaderService
from gateway.tools.robots import RobotsCache
from gateway.tools.search.tool import SearchTool

log = logging.getLogger("egress_gateway")

POLICY_POLL_INTERVAL_S = 1.0
STORE_PING_INTERVAL_S = 2.0


def _record_reload(ok: bool, generation: int) -> None:
    metrics.POLICY_RELOADS.labels(outcome="success" if ok else "failure").inc()
    metrics.POLICY_GENERATION.set(generation)


def _record_dns(duration_s: float) -> None:
    metrics.DNS_LOOKUP_SECONDS.observe(duration_s)


class Gateway:
    """All listeners of one gateway process and the state they share."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.policy = PolicyHolder(settings.policy_path, on_reload=self._policy_reloaded)
        metrics.POLICY_GENERATION.set(self.policy.current.generation)
        self.audit = AuditLog(settings.audit_log)
        self.store: BudgetStore = open_store(settings.redis_url)
        self.ssl_context = build_ssl_context(settings.ca_bundle)
        self._runners: list[web.AppRunner] = []
        self._draining = False
        self._listeners_bound = False
        self._store_up = settings.redis_url is None
        self._stopped = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []
        self.proxy: ProxyServer | None = None
        self._core_built = False
        # Built in start(): aiodns needs the running loop.
        self.resolver: Resolver
        self.core: EgressCore
        self.client: GuardedClient

    def readiness(self) -> tuple[bool, dict[str, bool]]:
        checks = {
            "policy_loaded": True,
            "listeners_bound": self._listeners_bound,
            "store_reachable": self._store_up,
            "not_draining": not self._draining,
        }
        return all(checks.values()), checks

    async def _serve_app(self, app: web.Application, listen: ListenAddress) -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        # In-flight tool calls get the drain grace too; none runs past its own 30 s deadline anyway.
        grace_s = self.policy.current.policy.proxy.drain_grace_s
        await web.TCPSite(runner, listen.host, listen.port, reuse_address=True, shutdown_timeout=grace_s).start()
        self._runners.append(runner)

    def build_core(self) -> None:
        """The resolver, egress core, guarded client and extraction pool (inside the loop)."""
        self.resolver = Resolver(self.settings.nameservers, timeout_s=self.settings.dns_timeout_s)
        self.core = EgressCore(
            self.resolver, lambda: self.policy.current, self.settings.listen_addresses, on_dns=_record_dns
        )
        self.client = GuardedClient(self.core, self.ssl_context, self.settings.user_agent)
        self.extraction = ExtractionPool()
        self._core_built = True

    def _policy_reloaded(self, ok: bool, generation: int) -> None:
        _record_reload(ok, generation)
        if ok and self.proxy is not None:
            self.proxy.policy_reloaded()  # live permission: close what the new policy denies

    async def start(self) -> None:
        self.build_core()
        self.proxy = ProxyServer(self.core, self.audit)
        await self.proxy.start(self.settings.proxy_listen.host, self.settings.proxy_listen.port)
        await self._serve_app(self.tools_api().app(), self.settings.api_listen)
        await self._serve_app(build_admin_app(self.readiness), self.settings.admin_listen)
        self._listeners_bound = True
        self._background.append(spawn(self._watch_policy_file(), name="policy-watch"))
        self._background.append(spawn(self._watch_store(), name="store-watch"))
        log.info(
            "egress-gateway listening: proxy %s, api %s, admin %s",
            self.settings.proxy_listen,
            self.settings.api_listen,
            self.settings.admin_listen,
        )

    def tools_api(self) -> ToolsApi:
        settings = self.settings
        reader = (
            ReaderService(settings.fetch_reader_url, settings.fetch_reader_key) if settings.fetch_reader_url else None
        )
        robots = RobotsCache()
        return ToolsApi(
            lambda: self.policy.current,
            ToolCalls(self.store, lambda: self.policy.current),
            FetchTool(self.client, self.extraction, robots, reader),
            SearchTool(self.client, self.store, settings),
            self.audit,
        )

    async def _watch_policy_file(self) -> None:
        while True:
            await asyncio.sleep(POLICY_POLL_INTERVAL_S)
            if self.policy.changed_on_disk():
                self.policy.reload()

    async def _watch_store(self) -> None:
        while True:
            self._store_up = await self.store.ping()
            metrics.STORE_UP.set(1 if self._store_up else 0)
            await asyncio.sleep(STORE_PING_INTERVAL_S)

    def request_stop(self) -> None:
        self._draining = True
        self._stopped.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        await self.start()
        loop.add_signal_handler(signal.SIGTERM, self.request_stop)
        loop.add_signal_handler(signal.SIGINT, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self.policy.reload)
        # Start-up objects live for the whole run: keep them out of every later full collection,
        # which otherwise pauses the loop for 15-25 ms while proxy tunnels wait.
        gc.collect()
        gc.freeze()
        await self._stopped.wait()
        grace_s = self.policy.current.policy.proxy.drain_grace_s
        log.info("draining for up to %.1f s", grace_s)
        if self.proxy is not None:
            await self.proxy.drain(grace_s)
        await self.shutdown()

    async def shutdown(self) -> None:
        self._draining = True
        for task in self._background:
            task.cancel()
        if not self._core_built:
            return
        if self.proxy is not None:
            await self.proxy.close()
        for runner in reversed(self._runners):
            await runner.cleanup()
        with contextlib.suppress(Exception):
            await self.store.close()
        await self.resolver.close()
        self.extraction.close()
        self.audit.close()


def run_daemon(settings: Settings) -> None:
    try:
        import uvloop  # noqa: PLC0415 - optional accelerator
    except ImportError:
        asyncio.run(Gateway(settings).run())
        return
    uvloop.run(Gateway(settings).run())
