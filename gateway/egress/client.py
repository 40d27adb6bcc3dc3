"""The guarded HTTP client that web_fetch and web_search use, and nothing else.

Takes a URL its caller already vetted under the policy in force and an absolute deadline. Each
hop: decide and pin the target, connect only to the pinned address (TLS with SNI and hostname
checks against the name), read the body under a wire cap and a decoded cap. Redirects are
followed by hand, each Location vetted like the first URL; https→http is refused; a request
that carries a credential follows none. The caller's deadline covers DNS, connect, every hop and
the body; nothing here starts a timer of its own.
No cookies, no proxy from the environment, no caller-controlled headers beyond what the tools set.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import aiohttp
import yarl
from multidict import CIMultiDict

from gateway.egress.connect import PinnedResolver, TlsTrust
from gateway.egress.deadline import Deadline
from gateway.egress.decompress import BoundedBody
from gateway.egress.io_errors import mapped_io_errors
from gateway.egress.target import EgressCore, PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.observe import metrics
from gateway.policy.decide import vet_url_for
from gateway.policy.inspect_decide import RequestFacts, decide_request
from gateway.policy.model import FetchSettings, LoadedPolicy, Policy, Principal
from gateway.vet.urls import VettedUrl

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
READ_CHUNK_BYTES = 64 * 1024
# aiohttp's own header-count limit, above ours: it stops a flood while parsing (bounded memory),
# and the cap is then counted on the parsed head where it can be reported as `too_large`.
HEADER_COUNT_CEILING_FACTOR = 4


@dataclass(frozen=True, slots=True)
class OutboundRequest:
    url: VettedUrl
    method: str = "GET"
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    # A credential (Authorization, API key) must never be replayed to wherever a redirect points.
    carries_credential: bool = False
    refuse_secret_params: bool = True
    follow_redirects: bool = True


@dataclass(frozen=True, slots=True)
class FetchedResponse:
    url: str
    status: int
    reason: str
    headers: CIMultiDict[str]
    body: bytes
    wire_bytes: int
    redirects: tuple[str, ...]
    address: str
    generation: int
    # Report mode: the first denial a hop would have met under enforce, for the audit log.
    would_deny: GatewayError | None = None

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


class GuardedClient:
    """One instance per process; every call builds its own pinned connector."""

    def __init__(self, core: EgressCore, trust: TlsTrust, user_agent: str) -> None:
        self._core = core
        self._trust = trust
        self._user_agent = user_agent

    async def fetch(
        self,
        request: OutboundRequest,
        *,
        principal: Principal,
        limits: FetchSettings,
        deadline: Deadline,
        loaded: LoadedPolicy | None = None,
    ) -> FetchedResponse:
        """Run `request` until `deadline`, following vetted redirects."""
        loaded = loaded or self._core.loaded
        try:
            async with asyncio.timeout_at(deadline.at):
                return await self._follow(request, principal, limits, loaded)
        except TimeoutError:
            raise deadline.expired_error() from None

    async def _follow(
        self, request: OutboundRequest, principal: Principal, limits: FetchSettings, loaded: LoadedPolicy
    ) -> FetchedResponse:
        vetted = request.url
        method = request.method
        body = request.body
        hops: list[str] = []
        would_deny: GatewayError | None = None
        next_url = vetted.url
        while True:
            try:
                if hops:
                    vetted = vet_url_for(loaded.policy, next_url, refuse_secrets=request.refuse_secret_params)
                # An inspected host's request rules, before any byte of this hop is sent (issue 25).
                if principal.inspect or loaded.policy.defaults.inspect:
                    judge_outbound(loaded.policy, principal, vetted, method, request.headers)
                target = await self._core.pin(principal, vetted.host, vetted.port, loaded=loaded)
            except GatewayError as exc:
                if hops and exc.code in (ErrorCode.UNSAFE_URL, ErrorCode.BLOCKED_DESTINATION, ErrorCode.POLICY_DENIED):
                    raise GatewayError(
                        ErrorCode.REDIRECT_BLOCKED, f"redirect hop {len(hops)} refused ({exc.code}): {exc.message}"
                    ) from None
                raise
            would_deny = would_deny or target.would_deny
            response, location = await self._one_hop(
                vetted, target, method=method, body=body, request=request, limits=limits
            )
            if location is None or not request.follow_redirects:
                return dataclasses.replace(response, redirects=tuple(hops), would_deny=would_deny)
            if request.carries_credential:
                raise GatewayError(ErrorCode.REDIRECT_BLOCKED, "a request carrying a credential follows no redirect")
            if len(hops) >= limits.max_redirects:
                raise GatewayError(ErrorCode.REDIRECT_BLOCKED, f"more than {limits.max_redirects} redirects")
            next_url = _resolve_location(vetted.url, location)
            if vetted.scheme == "https" and next_url.startswith("http:"):
                raise GatewayError(ErrorCode.REDIRECT_BLOCKED, "redirect from https to http refused (downgrade)")
            hops.append(vetted.url)
            if response.status == 303 or (response.status in (301, 302) and method == "POST"):
                method, body = "GET", None

    async def _one_hop(
        self,
        vetted: VettedUrl,
        target: PinnedTarget,
        *,
        method: str,
        body: bytes | None,
        request: OutboundRequest,
        limits: FetchSettings,
    ) -> tuple[FetchedResponse, str | None]:
        headers = CIMultiDict(request.headers)
        headers.setdefault("User-Agent", self._user_agent)
        headers.setdefault("Accept-Encoding", "gzip, deflate, br")
        connector = aiohttp.TCPConnector(
            resolver=PinnedResolver(target),
            ssl=await self._trust.context() if vetted.scheme == "https" else False,
            use_dns_cache=False,
            force_close=True,
            limit=1,
        )
        async with aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            auto_decompress=False,
            max_line_size=limits.max_header_line_bytes,
            max_field_size=limits.max_header_line_bytes,
            max_headers=limits.max_headers * HEADER_COUNT_CEILING_FACTOR,
            # uvloop 0.23 loses the tail of a TLS stream whose peer closes without close_notify
            # while reading is paused by flow control (uvloop PR 661). A read buffer as large as
            # the wire cap never pauses below the cap, and the body is bounded by it anyway.
            read_bufsize=limits.max_wire_bytes + READ_CHUNK_BYTES,
            skip_auto_headers=("User-Agent",),
        ) as session:
            with mapped_io_errors(target):
                async with session.request(
                    method,
                    yarl.URL(vetted.url, encoded=True),
                    headers=headers,
                    data=body,
                    allow_redirects=False,
                ) as resp:
                    # aiohttp refuses only past a ceiling, and says so in a type shared with other
                    # malformed heads: the cap itself is counted here, so it is named as such.
                    if len(resp.raw_headers) > limits.max_headers:
                        raise GatewayError(
                            ErrorCode.TOO_LARGE, f"{target.name} sent more than {limits.max_headers} header fields"
                        )
                    location = resp.headers.get("Location") if resp.status in REDIRECT_STATUSES else None
                    max_wire, max_decoded = limits.max_wire_bytes, limits.max_decoded_bytes
                    if _declares_pdf(resp.headers.get("Content-Type")):
                        # web_fetch's PDF cap: a declared PDF may be larger than an HTML page.
                        max_wire = max_decoded = limits.max_pdf_bytes
                    bounded = BoundedBody(
                        None if location else resp.headers.get("Content-Encoding"),
                        max_wire_bytes=max_wire,
                        max_decoded_bytes=max_decoded,
                    )
                    if location is None:
                        async for chunk in resp.content.iter_chunked(READ_CHUNK_BYTES):
                            bounded.feed(chunk)
                    peer = (
                        resp.connection.transport.get_extra_info("peername")
                        if resp.connection and resp.connection.transport
                        else None
                    )
                    fetched = FetchedResponse(
                        url=vetted.url,
                        status=resp.status,
                        reason=resp.reason or "",
                        headers=CIMultiDict(resp.headers),
                        body=bounded.result(),
                        wire_bytes=bounded.wire_bytes,
                        redirects=(),
                        address=str(peer[0]) if peer else str(target.addresses[0]),
                        generation=target.generation,
                    )
                    return fetched, location


def judge_outbound(
    policy: Policy, principal: Principal, vetted: VettedUrl, method: str, headers: tuple[tuple[str, str], ...]
) -> None:
    """Raise the refusal when an `inspect` entry's rules deny this request (the decision the
    proxy makes inside terminated TLS and on plain HTTP)."""
    facts = RequestFacts(vetted.host.name, vetted.port, vetted.scheme == "https", method, vetted.target, headers)
    verdict = decide_request(policy, principal, facts)
    if verdict.inspected:
        metrics.INSPECTED_REQUESTS.labels(verdict.verdict, str(verdict.code or "none")).inc()
    if verdict.verdict == "deny":
        raise verdict.refusal()


def _declares_pdf(content_type: str | None) -> bool:
    return (content_type or "").split(";", 1)[0].strip().lower() in ("application/pdf", "application/x-pdf")


def _resolve_location(base: str, location: str) -> str:
    try:
        return str(yarl.URL(base, encoded=True).join(yarl.URL(location)))
    except (ValueError, TypeError):
        raise GatewayError(ErrorCode.REDIRECT_BLOCKED, "redirect Location cannot be parsed") from None
