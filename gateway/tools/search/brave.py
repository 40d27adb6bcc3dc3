"""Brave Search's public results page (`GET search.brave.com/search`), asked and read.

Owns the query parameters (`tf` time filter, `source=web`, country cookie from region) and the
reading of web rows (`div[data-type=web]`) in both layouts seen in the wild: 2022's
`a.result-header` / `p.snippet-description` and the 2024+ Svelte page's `div.title` /
`div.generic-snippet .content`. Sitelinks nested in a row, videos, news and infoboxes are not
rows. Brave's "Solve the Captcha" page is a challenge whatever its status. Pure; never opens a
socket.
"""

from __future__ import annotations

import datetime as dt
import re
from types import MappingProxyType
from typing import TYPE_CHECKING
from urllib.parse import urlencode, urlsplit

from gateway.tools.search.engine import (
    TEXT_BROWSER_USER_AGENT,
    EngineOutcome,
    EngineSpec,
    RawRow,
    node_text,
    status_outcome,
)
from gateway.tools.search.query import SearchQuery
from gateway.tools.search.transport import EngineReply, EngineRequest

if TYPE_CHECKING:
    from selectolax.lexbor import LexborHTMLParser, LexborNode

NAME = "brave"
DEFAULT_URL = "https://search.brave.com/search"
_TIME_FILTERS = MappingProxyType({"d": "pd", "w": "pw", "m": "pm", "y": "py"})
# Brave prefixes snippets with the page age ("3 weeks ago - ", "Jun 23, 2025 - "); it is not text
# the page holds.
_AGE_PREFIX_RE = re.compile(
    r"^(?:\d+ (?:second|minute|hour|day|week|month|year)s? ago|[A-Z][a-z]{2,8} \d{1,2}, \d{4})"
    r"\s+[-\u2013]\s+"
)
_NO_RESULT_PHRASES = ("no results found", "not many great matches")


def build_request(query: SearchQuery, key: str | None, base_url: str, *, today: dt.date) -> EngineRequest:
    del key, today  # free engine; time filters are relative
    params: list[tuple[str, str]] = [("q", query.with_site_operator()), ("source", "web")]
    if query.time_range:
        params.append(("tf", _TIME_FILTERS[query.time_range]))
    # Brave takes locale from cookies (searx brave.py); `all` is its no-country setting.
    country = "all"
    if query.region and not query.region.startswith("wt-"):
        country = query.region.split("-")[0]
    headers = (
        ("User-Agent", TEXT_BROWSER_USER_AGENT),
        ("Accept", "text/html"),
        ("Accept-Language", "en;q=0.9"),
        ("Cookie", f"country={country}; useLocation=0; summarizer=0"),
    )
    return EngineRequest("GET", f"{base_url}?{urlencode(params)}", headers, None)


def is_challenge(tree: LexborHTMLParser) -> bool:
    title = node_text(tree.css_first("title")).lower()
    if "captcha" in title:
        return True
    body = tree.body
    text = node_text(body).lower() if body is not None else ""
    return "flagged as being suspicious" in text


def _row_url(row: LexborNode) -> str:
    for anchor in row.css("a[href]"):
        href = (anchor.attributes.get("href") or "").strip()
        # A link without a host is Brave's own navigation, or an ad (searx brave.py).
        if urlsplit(href).netloc:
            return href
    return ""


def _row_title(row: LexborNode) -> str:
    title_div = row.css_first("div.title")
    if title_div is not None:
        return (title_div.attributes.get("title") or "").strip() or node_text(title_div)
    return node_text(row.css_first(".snippet-title")) or node_text(row.css_first("a"))


def _row_snippet(row: LexborNode) -> str:
    node = (
        row.css_first("div.generic-snippet div.content")
        or row.css_first("p.snippet-description")
        or row.css_first("div.snippet-description")
        or row.css_first(".snippet-content")
    )
    return _AGE_PREFIX_RE.sub("", node_text(node))


def parse(reply: EngineReply) -> EngineOutcome:
    from selectolax.lexbor import LexborHTMLParser  # noqa: PLC0415 - lexbor loads with the first HTML page

    tree = LexborHTMLParser(reply.text())
    rows_nodes = tree.css('div[data-type="web"]')
    if not rows_nodes and is_challenge(tree):
        return EngineOutcome.challenge(f"captcha page (HTTP {reply.status})")
    failed = status_outcome(reply)
    if failed is not None:
        return failed
    rows: list[RawRow] = []
    for node in rows_nodes:
        url = _row_url(node)
        title = _row_title(node)
        if not url or not title:
            continue
        sponsored = node.css_first(".ad-badge") is not None or "ad" in (node.attributes.get("data-type-ad") or "")
        rows.append(RawRow(title=title, url=url, snippet=_row_snippet(node), sponsored=sponsored))
    if rows:
        return EngineOutcome.results(rows)
    body = tree.body
    text = node_text(body).lower() if body is not None else ""
    if any(phrase in text for phrase in _NO_RESULT_PHRASES):
        return EngineOutcome.no_results("no results message")
    return EngineOutcome.unrecognised("no web rows")


ENGINE = EngineSpec(
    name=NAME,
    tier="free",
    needs_key=False,
    default_url=DEFAULT_URL,
    build_request=build_request,
    parse=parse,
)
