"""web_fetch: one page, through the guarded client, as clean text with continuation.

Arguments are vetted before any reservation (bad input costs no budget). The page is fetched
with the policy's caps and deadline, challenge pages and binary bodies are refused, HTML becomes
markdown (or plain text, or cleaned HTML, as the caller asks) off the event loop, and a window of
the text is returned with the SHA-256 of the whole extracted text so a caller can continue at
`nextOffset` and notice a page that changed: strictly with `expectedHash`, or told in
`contentChanged` against the hash this gateway last served that principal for that URL.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import orjson

from gateway.egress.client import FetchedResponse, GuardedClient, OutboundRequest
from gateway.egress.deadline import Deadline
from gateway.errors import ErrorCode, GatewayError
from gateway.observe import metrics
from gateway.policy.decide import vet_url_for
from gateway.policy.model import LoadedPolicy, Principal
from gateway.tools.extract.pool import ExtractionPool
from gateway.tools.extract.render import RenderLimits
from gateway.tools.extract.render_options import LINK_STYLES, OUTPUT_FORMATS, LinkStyle, OutputFormat, RenderOptions
from gateway.tools.result_notice import NOTICE, retrieved_at
from gateway.tools.robots import RobotsCache
from gateway.tools.schemas import (
    FETCH_DEFAULT_MAX_CHARS,
    FETCH_MAX_MAX_CHARS,
    FETCH_MAX_OFFSET,
    FETCH_MIN_MAX_CHARS,
    SHA256_HEX_PATTERN,
    argument_names,
)
from gateway.tools.terminal_safe import Stripper
from gateway.vet.urls import VettedUrl

ACCEPT = "text/markdown, text/html;q=0.9, */*;q=0.5"
MIN_MAX_CHARS, MAX_MAX_CHARS, DEFAULT_MAX_CHARS = FETCH_MIN_MAX_CHARS, FETCH_MAX_MAX_CHARS, FETCH_DEFAULT_MAX_CHARS
# Hashes served per (principal, URL), remembered so that a continuation without expectedHash
# can still say whether the page changed; the oldest are forgotten first.
MAX_REMEMBERED_HASHES = 4_096
MAX_RESPONSE_BYTES = 64 * 1024
# Room kept for every field but `content` (links, urls, title, budget) inside the 64 KiB bound.
RESPONSE_OVERHEAD_BYTES = 12 * 1024
ERROR_PAGE_CHARS = 2_000
MAX_TITLE_CHARS = 300
# The arguments are declared once, in gateway.tools.schemas (the MCP, OpenAPI and /v1/tools source).
ALLOWED_FIELDS = argument_names("fetch")
SHA256_HEX = re.compile(SHA256_HEX_PATTERN)
# Failures that say the host itself cannot be reached or may not be reached: the page would fail
# the same way, so they are reported as they are instead of as "robots.txt unreachable".
HOST_FAILURES = frozenset(
    {
        ErrorCode.DNS_FAILURE, ErrorCode.CONNECT_FAILURE, ErrorCode.BLOCKED_DESTINATION,
        ErrorCode.POLICY_DENIED, ErrorCode.TIMEOUT, ErrorCode.POLICY_CHANGED,
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class FetchArgs:
    url: str
    max_chars: int = DEFAULT_MAX_CHARS
    offset: int = 0
    expected_hash: str | None = None
    format: OutputFormat = "markdown"
    links: LinkStyle = "inline"


def _invalid(message: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_INPUT, message)


def _int_field(payload: Mapping[str, object], name: str, default: int, low: int, high: int) -> int:
    value = payload.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"{name} must be an integer")
    if not low <= value <= high:
        raise _invalid(f"{name} must be between {low} and {high}")
    return value


def _choice_field(payload: Mapping[str, object], name: str, choices: tuple[str, ...]) -> str:
    value = payload.get(name, choices[0])
    if not isinstance(value, str) or value not in choices:
        raise _invalid(f"{name} must be one of {', '.join(choices)}")
    return value


def parse_fetch_args(payload: object) -> FetchArgs:
    if not isinstance(payload, Mapping):
        raise _invalid("the request body must be a JSON object")
    unknown = sorted(set(payload) - ALLOWED_FIELDS)
    if unknown:
        raise _invalid(f"unknown field {unknown[0]!r}")
    url = payload.get("url")
    if not isinstance(url, str) or not url:
        raise _invalid("url is required and must be a string")
    max_chars = _int_field(payload, "maxChars", DEFAULT_MAX_CHARS, MIN_MAX_CHARS, MAX_MAX_CHARS)
    offset = _int_field(payload, "offset", 0, 0, FETCH_MAX_OFFSET)
    expected = payload.get("expectedHash")
    if expected is not None and (not isinstance(expected, str) or not SHA256_HEX.match(expected)):
        raise _invalid("expectedHash must be the 64-hex-digit contentHash of an earlier call")
    output: Any = _choice_field(payload, "format", OUTPUT_FORMATS)
    links: Any = _choice_field(payload, "links", LINK_STYLES)
    return FetchArgs(url, max_chars, offset, expected.lower() if isinstance(expected, str) else None, output, links)


@dataclass(frozen=True, slots=True)
class ReaderService:
    """A reader service (`EGRESS_FETCH_READER_URL`): it fetches the page and returns its text."""

    url_template: str
    key: str | None

    def request_url(self, page_url: str) -> str:
        encoded = quote(page_url, safe="")
        if "{url}" in self.url_template:
            return self.url_template.replace("{url}", encoded)
        return self.url_template.rstrip("/") + "/" + page_url


def fit_window(text: str, offset: int, max_chars: int, budget_bytes: int) -> str:
    """The longest prefix of text[offset:offset+max_chars] whose JSON encoding fits budget_bytes."""
    window = text[offset : offset + max_chars]
    if len(orjson.dumps(window)) <= budget_bytes:
        return window
    low, high = 0, len(window)
    while low < high:
        middle = (low + high + 1) // 2
        if len(orjson.dumps(window[:middle])) <= budget_bytes:
            low = middle
        else:
            high = middle - 1
    return window[:low]


class FetchTool:
    def __init__(
        self,
        client: GuardedClient,
        extraction: ExtractionPool,
        robots: RobotsCache,
        reader: ReaderService | None = None,
    ) -> None:
        self._client = client
        self._extraction = extraction
        self._robots = robots
        self._reader = reader
        self._served_hashes: OrderedDict[tuple[str, str, str, str], str] = OrderedDict()

    def vet(self, args: FetchArgs, loaded: LoadedPolicy) -> VettedUrl:
        return vet_url_for(loaded.policy, args.url)

    async def fetch(
        self,
        args: FetchArgs,
        vetted: VettedUrl,
        principal: Principal,
        loaded: LoadedPolicy,
        audit: dict[str, Any],
    ) -> dict[str, Any]:
        """The result object; `audit` receives what the audit line needs (report-mode denials)."""
        limits = loaded.policy.fetch
        # One deadline over everything (robots.txt, every hop, extraction), not one per request.
        deadline = Deadline.after(limits.deadline_s)
        if self._reader is None and limits.robots == "respect":
            await self._check_robots(vetted, principal, loaded, deadline)
        response = await self._get(vetted, principal, loaded, deadline)
        audit["address"] = response.address  # the vetted address the answer came from
        if response.would_deny is not None:
            audit["would_deny"] = response.would_deny.code
            audit["would_deny_reason"] = response.would_deny.message
        metrics.FETCH_BODY_BYTES.labels(stage="wire").observe(response.wire_bytes)
        metrics.FETCH_BODY_BYTES.labels(stage="decoded").observe(len(response.body))
        try:
            async with asyncio.timeout_at(deadline.at):
                return await self._render(args, vetted, response, loaded, principal)
        except TimeoutError:
            raise deadline.expired_error() from None

    async def _check_robots(
        self, vetted: VettedUrl, principal: Principal, loaded: LoadedPolicy, deadline: Deadline
    ) -> None:
        async def fetch_robots(url: str) -> tuple[int, bytes] | None:
            try:
                robots = await self._client.fetch(
                    OutboundRequest(url=vet_url_for(loaded.policy, url), headers=(("Accept", "text/plain"),)),
                    principal=principal,
                    limits=loaded.policy.fetch,
                    deadline=deadline,
                    loaded=loaded,
                )
            except GatewayError as exc:
                if exc.code in (ErrorCode.TOO_LARGE, ErrorCode.UNSUPPORTED_CONTENT):
                    return 200, b""
                if exc.code in HOST_FAILURES:
                    raise
                return None
            return robots.status, robots.body

        await self._robots.check(vetted.origin, vetted.target, fetch_robots, ttl_s=loaded.policy.fetch.robots_cache_s)

    async def _get(
        self, vetted: VettedUrl, principal: Principal, loaded: LoadedPolicy, deadline: Deadline
    ) -> FetchedResponse:
        if self._reader is not None:
            headers: tuple[tuple[str, str], ...] = (("Accept", "text/plain, text/markdown;q=0.9"),)
            if self._reader.key:
                headers += (("Authorization", f"Bearer {self._reader.key}"),)
            request = OutboundRequest(
                url=vet_url_for(loaded.policy, self._reader.request_url(vetted.url), refuse_secrets=False),
                headers=headers,
                carries_credential=bool(self._reader.key),
                refuse_secret_params=False,
            )
        else:
            request = OutboundRequest(url=vetted, headers=(("Accept", ACCEPT),))
        return await self._client.fetch(
            request, principal=principal, limits=loaded.policy.fetch, deadline=deadline, loaded=loaded
        )

    def _changed_since_served(self, key: tuple[str, str, str, str], content_hash: str) -> bool | None:
        """Whether the text differs from the last one served for this key (None: none remembered)."""
        served = self._served_hashes.get(key)
        self._served_hashes[key] = content_hash
        self._served_hashes.move_to_end(key)
        while len(self._served_hashes) > MAX_REMEMBERED_HASHES:
            self._served_hashes.popitem(last=False)
        return None if served is None else served != content_hash

    async def _render(
        self, args: FetchArgs, vetted: VettedUrl, response: FetchedResponse, loaded: LoadedPolicy, principal: Principal
    ) -> dict[str, Any]:
        headers = {k.lower(): v for k, v in response.headers.items()}
        fetch = loaded.policy.fetch
        page = await self._extraction.render(
            response.body,
            headers.get("content-type"),
            response.status,
            headers,
            response.url,
            limits=RenderLimits(
                max_chars=fetch.max_source_chars,
                convert_html=self._reader is None,
                options=RenderOptions(args.format, args.links),
                max_pdf_pages=fetch.max_pdf_pages,
                # PDF pages are read until 80% of the cap, then the text so far is returned.
                pdf_time_s=fetch.convert_timeout_s * 0.8,
            ),
            time_limit_s=fetch.convert_timeout_s,
        )
        page.raise_refusal()
        if page.challenge is not None:
            raise GatewayError(
                ErrorCode.CHALLENGED, f"{vetted.host.name} answered with a bot challenge: {page.challenge}"
            )
        # Before hashing and windowing: offsets, totalChars and contentHash describe the text served.
        strip = Stripper()
        text, title, source_truncated = strip(page.text), strip(page.title), page.source_truncated
        links = [{"text": strip(text)[:200], "url": strip(url)[:2000]} for text, url in page.links[:20]]
        if response.status >= 400:
            raise GatewayError(
                ErrorCode.UPSTREAM_STATUS,
                # The standard phrase, not the origin's: no error message quotes upstream bytes.
                f"{vetted.host.name} answered {response.status} {_status_phrase(response.status)}".strip(),
                extra={"status": response.status, "page": text[:ERROR_PAGE_CHARS]},
            )
        content_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
        # The same page in another format or link style is another text with another hash.
        changed = self._changed_since_served((principal.name, vetted.url, args.format, args.links), content_hash)
        if args.offset > 0:
            if args.expected_hash is not None and content_hash != args.expected_hash:
                raise GatewayError(
                    ErrorCode.CONTENT_CHANGED, "the page changed since expectedHash; start again at offset 0"
                )
            if args.offset >= len(text):
                raise _invalid(f"offset {args.offset} is past the end of the text ({len(text)} characters)")
        window = fit_window(text, args.offset, args.max_chars, MAX_RESPONSE_BYTES - RESPONSE_OVERHEAD_BYTES)
        end = args.offset + len(window)
        return {
            "url": vetted.url,
            "finalUrl": strip(response.url),
            "title": title[:MAX_TITLE_CHARS],
            "contentType": page.content_type,
            "retrievedAt": retrieved_at(),
            "content": window,
            "contentHash": content_hash,
            "offset": args.offset,
            "nextOffset": end if end < len(text) else None,
            "totalChars": len(text),
            "truncated": end < len(text),
            "sourceTruncated": source_truncated,
            # Continuations only: false when expectedHash matched; without it, against the hash
            # last served for this URL (null when none is remembered).
            "contentChanged": (False if args.expected_hash is not None else changed) if args.offset > 0 else None,
            "links": links,
            "controlCharsRemoved": strip.removed,
            "notice": NOTICE,
        }


def _status_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""
