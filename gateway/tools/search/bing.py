"""Bing's HTML results page (`GET www.bing.com/search`), asked and read.

Owns the query parameters (market from region, time filters) and the reading of organic
`#b_results > li.b_algo` rows only: answer cards, ads (`li.b_ad`, `aclick` links) and verticals
are not results. Result links are usually `bing.com/ck/a?...&u=a1<base64url>` wrappers, decoded by
`links.unwrap_redirect`. Bing answers its bot check with HTTP 200 ("One last step", Turnstile), so
the page is judged by its content, not its status. Pure; never opens a socket.
"""

from __future__ import annotations

import datetime as dt
from types import MappingProxyType
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from gateway.tools.search.engine import (
    TEXT_BROWSER_USER_AGENT,
    EngineOutcome,
    EngineSpec,
    RawRow,
    node_text,
    status_outcome,
)
from gateway.tools.search.links import host_of, unwrap_redirect
from gateway.tools.search.query import SearchQuery
from gateway.tools.search.transport import EngineReply, EngineRequest

if TYPE_CHECKING:
    from selectolax.lexbor import LexborHTMLParser, LexborNode

NAME = "bing"
DEFAULT_URL = "https://www.bing.com/search"
# Bing's relative freshness filters: ez1 day, ez2 week, ez3 month. A year has no relative code
# (ez5 wants absolute day numbers), so it is expressed as an absolute range from `today`.
_RELATIVE_FILTERS = MappingProxyType({"d": 'ex1:"ez1"', "w": 'ex1:"ez2"', "m": 'ex1:"ez3"'})
_DAYS_PER_YEAR = 365


def _market(region: str) -> str | None:
    # Our region codes are DuckDuckGo's `country-language`; Bing's market is `language-COUNTRY`.
    country, language = region.split("-")
    if country == "wt":
        return None
    return f"{language}-{country.upper()}"


def build_request(query: SearchQuery, key: str | None, base_url: str, *, today: dt.date) -> EngineRequest:
    del key  # free engine
    params: list[tuple[str, str]] = [("q", query.with_site_operator())]
    accept_language = "en;q=0.9"
    if query.region and (market := _market(query.region)):
        params.append(("mkt", market))
        accept_language = f"{market},{market.split('-')[0]};q=0.9"
    if query.time_range is not None and query.time_range in _RELATIVE_FILTERS:
        params.append(("filters", _RELATIVE_FILTERS[query.time_range]))
    elif query.time_range == "y":
        day = (today - dt.date(1970, 1, 1)).days
        params.append(("filters", f'ex1:"ez5_{day - _DAYS_PER_YEAR}_{day}"'))
    headers = (
        ("User-Agent", TEXT_BROWSER_USER_AGENT),
        ("Accept", "text/html"),
        ("Accept-Language", accept_language),
    )
    return EngineRequest("GET", f"{base_url}?{urlencode(params)}", headers, None)


def is_challenge(tree: LexborHTMLParser) -> bool:
    captcha = tree.css_first("div.captcha")
    if captcha is not None and "last step" in node_text(captcha).lower():
        return True
    # Turnstile widget or verify endpoint with no organic rows: the 2026 captcha page. Result pages
    # mention `cf-turnstile` in a script list too, hence the b_algo check by the caller.
    return tree.css_first("#turnstile-widget") is not None or tree.css_first(".cf-turnstile") is not None


def _snippet(item: LexborNode) -> str:
    caption = item.css_first("div.b_caption p") or item.css_first("p")
    if caption is None:
        return ""
    # Bing puts a visually hidden type label (`<span class="algoSlug_icon">WEB</span>`) at the
    # start of the caption; its text is not part of the snippet and would run into the first word.
    for label in caption.css("span.algoSlug_icon"):
        label.decompose()
    return node_text(caption)


def parse(reply: EngineReply) -> EngineOutcome:
    from selectolax.lexbor import LexborHTMLParser  # noqa: PLC0415 - lexbor loads with the first HTML page

    tree = LexborHTMLParser(reply.text())
    items = tree.css("#b_results > li.b_algo")
    if not items and is_challenge(tree):
        return EngineOutcome.challenge(f"captcha page (HTTP {reply.status})")
    failed = status_outcome(reply)
    if failed is not None:
        return failed
    rows: list[RawRow] = []
    for item in items:
        anchor = item.css_first("h2 a")
        if anchor is None:
            continue
        href = (anchor.attributes.get("href") or "").strip()
        title = node_text(anchor)
        if not href or not title:
            continue
        sponsored = href.startswith(("https://www.bing.com/aclick", "/aclick"))
        # A wrapper that decodes to Bing's own verticals (images, videos) is navigation.
        if host_of(unwrap_redirect(href)).endswith("bing.com"):
            continue
        rows.append(RawRow(title=title, url=href, snippet=_snippet(item), sponsored=sponsored))
    if rows:
        return EngineOutcome.results(rows)
    if tree.css_first("#b_results > li.b_no") is not None:
        return EngineOutcome.no_results("b_no block")
    if tree.css_first("#b_results") is None:
        return EngineOutcome.unrecognised("no #b_results list")
    return EngineOutcome.unrecognised("no b_algo rows")


ENGINE = EngineSpec(
    name=NAME,
    tier="free",
    needs_key=False,
    default_url=DEFAULT_URL,
    build_request=build_request,
    parse=parse,
)
