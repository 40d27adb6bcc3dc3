"""The daemon: builds every component from Settings, binds the listeners, runs until SIGTERM.

Owns process-level wiring only: policy holder and its reload triggers (SIGHUP, file change),
the resolver, the egress core, the listeners, readiness, and the drain on SIGTERM. Each part's
behaviour lives in its own module.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import signal
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from aiohttp import web

from gateway import __version__
from gateway.budget import BudgetStore, open_store
from gateway.credentials.guard import OutboundGuard
from gateway.credentials.store import SecretStore
from gateway.egress.client import GuardedClient
from gateway.egress.connect import TlsTrust
from gateway.egress.own_addresses import own_addresses
from gateway.egress.resolver import Resolver
from gateway.egress.target import EgressCore
from gateway.errors import ErrorCode, GatewayError
from gateway.idle_trim import IdleTrim
from gateway.listener_guard import ListenerLimits, listener_limits, raise_open_files_limit, serve_guarded
from gateway.memory import limit_heap_retention
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
from gateway.tools.run_tokens import RunTokens, run_token_secret
from gateway.tools.search.registry import engines_from_settings
from gateway.tools.search.tool import SearchTool

if TYPE_CHECKING:
    from gateway.dnsguard.server import DnsListener
    from gateway.proxy.inspected.service import InspectService
    from gateway.transparent.listener import TransparentListener

log = logging.getLogger("egress_gateway")

POLICY_POLL_INTERVAL_S = 0.5
STORE_PING_INTERVAL_S = 2.0


def redact_url(url: str) -> str:
    """A URL without its user and password (a Redis URL's credentials never reach a log)."""
    parts = urlsplit(url)
    # Split by hand: a Sentinel or Cluster URL lists several host:port, which `parts.port` refuses.
    _, at, hosts = parts.netloc.rpartition("@")
    if not at:
        return url
    return urlunsplit((parts.scheme, f"***@{hosts}", parts.path, parts.query, parts.fragment))


def policy_file_sha256(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return "unreadable"


def _open_audit(settings: Settings) -> AuditLog:
    try:
        return AuditLog(
            settings.audit_log,
            on_failure=settings.audit_on_failure,
            max_bytes=settings.audit_max_bytes,
            keep_files=settings.audit_keep_files,
            aggregate_s=settings.audit_aggregate_s,
            http_paths=settings.audit_http_paths,
        )
    except OSError as exc:
        raise GatewayError(
            ErrorCode.INVALID_INPUT, f"EGRESS_AUDIT_LOG: cannot open {settings.audit_log}: {exc.strerror or exc}"
        ) from None


def _record_dns(duration_s: float) -> None:
    metrics.DNS_LOOKUP_SECONDS.observe(duration_s)


class Gateway:
    """All listeners of one gateway process and the state they share."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.policy = PolicyHolder(settings.policy_path, on_reload=self._record_reload)
        metrics.POLICY_GENERATION.set(self.policy.current.generation)
        self.policy_sha256 = policy_file_sha256(settings.policy_path)
        metrics.set_build_info(self.policy_sha256)
        self.audit = _open_audit(settings)
        # The credentials the gateway holds for its agents, and the outbound scan (issue 26).
        # A placeholder key that cannot be read stops the start here, as a bad policy does.
        self.secrets = SecretStore(settings.secret_env)
        self.secrets.load(self.policy.current.policy.credentials)
        self.guard = OutboundGuard(self.secrets, self.audit)
        self.store: BudgetStore = open_store(
            settings.redis_url, ca_bundle=settings.redis_ca_bundle, min_replicas=settings.redis_min_replicas
        )
        self.run_tokens = RunTokens(run_token_secret(settings))
        self.tls_trust = TlsTrust(settings.ca_bundle)
        self.idle_trim = IdleTrim()
        self._runners: list[web.AppRunner] = []
        self._draining = False
        self._listeners_bound = False
        self._store_up = settings.redis_url is None
        self._stopped = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []
        self.proxy: ProxyServer | None = None
        self.transparent: TransparentListener | None = None
        self.dns: DnsListener | None = None
        self._core_built = False
        # Built in start(): aiodns needs the running loop.
        self.resolver: Resolver
        self.core: EgressCore
        self.client: GuardedClient

    def _record_reload(self, ok: bool, generation: int) -> None:
        metrics.POLICY_RELOADS.labels(outcome="success" if ok else "failure").inc()
        metrics.POLICY_GENERATION.set(generation)
        if ok:
            self._reload_secrets()
            self.policy_sha256 = policy_file_sha256(self.settings.policy_path)
            metrics.set_build_info(self.policy_sha256)
            if self.proxy is not None:
                self.proxy.policy_reloaded()  # live permission: close what the new policy denies
            if self.transparent is not None:
                self.transparent.revalidate(self.policy.current)

    def _reload_secrets(self) -> None:
        try:
            self.secrets.load(self.policy.current.policy.credentials)
        except GatewayError as exc:
            # The policy in force changed; its credentials keep the last readable key's snapshot.
            log.error("credentials not reloaded: %s", exc.message)

    def readiness(self) -> tuple[bool, dict[str, bool]]:
        """Proxy readiness: the store is not part of it (a Redis outage fails tool calls closed but
        must not pull the proxy out of the Service); `tools_readiness` adds it."""
        checks = {
            # The policy in force came from a file that is still there to reload from (a
            # removed or unmounted file leaves the last good policy enforced, and says so here).
            "policy_loaded": self.policy.file_present(),
            "listeners_bound": self._listeners_bound,
            "audit_writable": self.audit.failure is None or self.settings.audit_on_failure == "allow",
            "not_draining": not self._draining,
        }
        return all(checks.values()), checks

    def tools_readiness(self) -> tuple[bool, dict[str, bool]]:
        ready, checks = self.readiness()
        checks["store_reachable"] = self._store_up
        return ready and self._store_up, checks

    def readiness_reasons(self) -> dict[str, str]:
        reasons: dict[str, str] = {}
        if not self.policy.file_present():
            generation = self.policy.current.generation
            reasons["policy_loaded"] = (
                f"the policy file {self.policy.path} is gone; generation {generation} stays in force"
            )
        if self.audit.failure is not None:
            reasons["audit_writable"] = self.audit.failure
        if not self._store_up:
            reasons["store_reachable"] = "the budget store does not answer: tool calls fail with store_unavailable"
        if self._draining:
            reasons["not_draining"] = "the gateway is draining for shutdown"
        return reasons

    async def _serve_app(self, app: web.Application, listen: ListenAddress, limits: ListenerLimits) -> None:
        # In-flight tool calls get the drain grace too; none runs past its own 30 s deadline anyway.
        grace_s = self.policy.current.policy.proxy.drain_grace_s
        runner = await serve_guarded(app, listen.host, listen.port, limits, shutdown_timeout_s=grace_s)
        self._runners.append(runner)

    def build_core(self) -> None:
        """The resolver, egress core, guarded client and extraction pool (inside the loop)."""
        self.resolver = Resolver(self.settings.nameservers, timeout_s=self.settings.dns_timeout_s)
        self.core = EgressCore(
            self.resolver,
            self.policy,
            own_addresses(listen.host for listen in self.settings.listen_addresses),
            on_dns=_record_dns,
        )
        self.core.admission = self.audit.refusal
        self.client = GuardedClient(self.core, self.tls_trust, self.settings.user_agent)
        self.extraction = ExtractionPool(self.settings.extract_workers, idle_exit_s=self.settings.extract_idle_exit_s)
        self._core_built = True

    async def start(self) -> None:
        self.build_core()
        # Proven writable before any listener takes traffic: a first line written and flushed
        # now. On a full disk or a dead mount it fails here, so /readyz says `audit_writable:
        # false` and (on_failure deny) the first request is refused, never allowed unaudited.
        self.audit.started(self.policy.current.generation)
        self.proxy = ProxyServer(self.core, self.audit, self.guard)
        self.proxy.inspection = self._inspection(self.proxy)
        await self.proxy.start(self.settings.proxy_listen.host, self.settings.proxy_listen.port)
        await self._start_interception()
        # Each listener has its own connection budget, sized from the raised open-files limit.
        api_limits, admin_limits = listener_limits(
            raise_open_files_limit(), self.policy.current.policy.proxy.head_timeout_s
        )
        await self._serve_app(self.tools_api().app(), self.settings.api_listen, api_limits)
        admin = build_admin_app(self.readiness, tools_readiness=self.tools_readiness, reasons=self.readiness_reasons)
        await self._serve_app(admin, self.settings.admin_listen, admin_limits)
        self._listeners_bound = True
        self._background.append(spawn(self._watch_policy_file(), name="policy-watch"))
        self._background.append(spawn(self._watch_store(), name="store-watch"))
        log.info("%s", self.startup_summary())

    def _inspection(self, proxy: ProxyServer) -> InspectService | None:
        """TLS interception when a CA is configured (issue 25). Without one, an inspected host is
        refused (`inspection_unsupported`), never spliced: a bypass comes only from policy."""
        settings = self.settings
        if not settings.inspect_ca_cert or not settings.inspect_ca_key:
            policy = self.policy.current.policy
            if policy.defaults.scan or any(p.scan for p in policy.principals.values()):
                # pipelock's lesson: a scanner that silently sees no HTTPS is worse than none.
                log.warning(
                    "outbound scanning is on but no interception CA is configured: only plain HTTP, "
                    "web_fetch URLs, web_search queries and DNS names are scanned, never HTTPS"
                )
            if policy.credentials.entries:
                log.warning(
                    "credentials are listed but no interception CA is configured: CONNECTs to their bound "
                    "hosts are refused (inspection_unsupported), so no placeholder or value leaves"
                )
            if any(p.inspect for p in self.policy.current.policy.principals.values()) or (
                self.policy.current.policy.defaults.inspect
            ):
                log.warning(
                    "the policy names inspect entries but no interception CA is configured "
                    "(EGRESS_INSPECT_CA_CERT, EGRESS_INSPECT_CA_KEY): CONNECTs to those hosts are refused; "
                    "plain HTTP to them is still judged"
                )
            return None
        from pathlib import Path  # noqa: PLC0415

        from gateway.inspect.authority import load_authority  # noqa: PLC0415
        from gateway.inspect.leaves import LeafContexts  # noqa: PLC0415
        from gateway.proxy.inspected.service import InspectService  # noqa: PLC0415

        authority = load_authority(settings.inspect_ca_cert, settings.inspect_ca_key)
        leaf_dir = Path(settings.inspect_leaf_dir) if settings.inspect_leaf_dir else None
        return InspectService(proxy, LeafContexts(authority, leaf_dir), self.tls_trust)

    def startup_summary(self) -> str:
        """One line saying what is in force, for the operator reading the start-up log."""
        settings = self.settings
        loaded = self.policy.current
        policy = loaded.policy
        engines = engines_from_settings(
            settings.search.engines,
            settings.search.keys,
            settings.search.urls,
            template_url=settings.search.template_url,
            template_key=settings.search.template_key,
            searxng_url=settings.search.urls.get("searxng"),
            mediawiki_url=settings.search.urls.get("mediawiki"),
        )
        enabled = [engine.name for engine in engines if engine.enabled]
        skipped = [f"{engine.name} (no key)" for engine in engines if not engine.enabled]
        return (
            f"egress-gateway {__version__} serving: policy {settings.policy_path} generation {loaded.generation} "
            f"sha256 {self.policy_sha256[:16]}, mode {policy.defaults.mode}, "
            f"principals {', '.join(sorted(policy.principals)) or 'none'}; "
            f"proxy {settings.proxy_listen}, api {settings.api_listen}, admin {settings.admin_listen}"
            f"{_interception_summary(settings)}; "
            f"engines {', '.join(enabled) or 'none'}; skipped {', '.join(skipped) or 'none'}; "
            f"store {redact_url(settings.redis_url) if settings.redis_url else 'memory'}; "
            f"CA bundle certifi{' + ' + settings.ca_bundle if settings.ca_bundle else ''}; "
            f"audit {settings.audit_log} (on failure {settings.audit_on_failure}); "
            f"nameservers {', '.join(settings.nameservers) or 'resolv.conf'}"
        )

    async def _start_interception(self) -> None:
        """The transparent TCP and DNS listeners, when their settings are set (off by default).

        Imported only then: a sidecar without interception never loads dnslib or these modules.
        """
        assert self.proxy is not None
        uids = [uid for uid, _ in self.policy.current.policy.transparent.principals]
        if self.settings.transparent_listen:
            from gateway.transparent.http import TransparentHttp  # noqa: PLC0415
            from gateway.transparent.listener import TransparentListener  # noqa: PLC0415

            http = TransparentHttp(self.proxy)
            self.transparent = TransparentListener(self.core, self.audit, self.proxy.tunnels, http)
            self.transparent.inspection = self.proxy.inspection
            await self.transparent.start(self.settings.transparent_listen, uids)
        if self.settings.dns_listen:
            from gateway.dnsguard.server import DnsListener  # noqa: PLC0415
            from gateway.dnsguard.upstream import Upstream  # noqa: PLC0415

            upstream = Upstream(self.settings.nameservers, self.settings.dns_timeout_s)
            self.dns = DnsListener(self.core, self.audit, upstream, self.guard)
            await self.dns.start(self.settings.dns_listen, uids)

    def tools_api(self) -> ToolsApi:
        settings = self.settings
        reader = (
            ReaderService(settings.fetch_reader_url, settings.fetch_reader_key) if settings.fetch_reader_url else None
        )
        robots = RobotsCache()
        return ToolsApi(
            lambda: self.policy.current,
            ToolCalls(self.store, lambda: self.policy.current, self.run_tokens, self.idle_trim),
            FetchTool(self.client, self.extraction, robots, reader),
            SearchTool(self.client, self.store, settings),
            self.audit,
            guard=self.guard,
        )

    async def _watch_policy_file(self) -> None:
        # The holder debounces (a change must hold for one more poll) and refuses a file caught
        # mid-write, so only complete files are ever enforced.
        while True:
            await asyncio.sleep(POLICY_POLL_INTERVAL_S)
            self.policy.poll()
            # A rotated credential file (a Secret's ..data swap) is read again: no restart.
            self.secrets.poll()

    async def _watch_store(self) -> None:
        while True:
            self._store_up = await self.store.ping()
            metrics.STORE_UP.set(1 if self._store_up else 0)
            await asyncio.sleep(STORE_PING_INTERVAL_S)

    def _reload_and_reopen(self) -> None:
        # logrotate's postrotate sends SIGHUP (or SIGUSR1, which only reopens the audit file).
        self.audit.reopen()
        self.policy.reload()

    def request_stop(self) -> None:
        self._draining = True
        self._stopped.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        await self.start()
        loop.add_signal_handler(signal.SIGTERM, self.request_stop)
        loop.add_signal_handler(signal.SIGINT, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self._reload_and_reopen)
        loop.add_signal_handler(signal.SIGUSR1, self.audit.reopen)
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
        if self.transparent is not None:
            self.transparent.close()
        if self.dns is not None:
            self.dns.close()
        if self.proxy is not None:
            await self.proxy.close()
        for runner in reversed(self._runners):
            await runner.cleanup()
        with contextlib.suppress(Exception):
            await self.store.close()
        await self.resolver.close()
        await self.extraction.close()
        self.idle_trim.close()
        self.audit.close()


def _interception_summary(settings: Settings) -> str:
    transparent = ", ".join(str(listen) for listen in settings.transparent_listen)
    dns = ", ".join(str(listen) for listen in settings.dns_listen)
    return (f", transparent {transparent}" if transparent else "") + (f", dns {dns}" if dns else "")


def run_daemon(settings: Settings) -> None:
    limit_heap_retention()
    try:
        import uvloop  # noqa: PLC0415 - optional accelerator
    except ImportError:
        asyncio.run(Gateway(settings).run())
        return
    uvloop.run(Gateway(settings).run())
