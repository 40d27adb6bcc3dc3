"""DuckDuckGo's no-JavaScript results page (`POST html.duckduckgo.com/html/`), asked and read.

Owns the form it posts (query, region `kl`, time range `df`) and the reading of the page: organic
`div.web-result` blocks only (ads are `result--ad`), the end-of-results block that carries the same
class (`result--no-result`), and the bot challenge DuckDuckGo answers with HTTP 202 (an anomaly page
with `challenge-form`). `parse_results_page` is reused by the template engine for HTML answers.
Pure; never opens a socket.
"""

from __future__ import annotations

import datetime as dt
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
from gateway.tools.search.query import SearchQuery
from gateway.tools.search.transport import EngineReply, EngineRequest

if TYPE_CHECKING:
    from selectolax.lexbor import LexborHTMLParser

NAME = "duckduckgo"
DEFAULT_URL = "https://html.duckduckgo.com/html/"
# DuckDuckGo's "search on Google" fallback row for queries it cannot answer: not a result.
_PSEUDO_RESULT_PREFIXES = ("http://www.google.com/search?", "https://www.google.com/search?")


def build_request(query: SearchQuery, key: str | None, base_url: str, *, today: dt.date) -> EngineRequest:
    del key, today  # free engine; time ranges are relative (df=d/w/m/y)
    form: list[tuple[str, str]] = [("q", query.with_site_operator()), ("b", "")]
    if query.region:
        form.append(("kl", query.region))
    if query.time_range:
        form.append(("df", query.time_range))
    headers = (
        ("User-Agent", TEXT_BROWSER_USER_AGENT),
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Accept", "text/html"),
        ("Accept-Language", "en;q=0.9"),
        ("Referer", "https://html.duckduckgo.com/"),
    )
    return EngineRequest("POST", base_url, headers, urlencode(form).encode("ascii"))


def is_challenge(tree: LexborHTMLParser) -> bool:
    return (
        tree.css_first("form#challenge-form") is not None
        or tree.css_first("form#img-form") is not None
        or tree.css_first("div.anomaly-modal__mask") is not None
    )


def parse_results_page(tree: LexborHTMLParser) -> EngineOutcome:
    """Read a DuckDuckGo-style page (also used for template engines answering HTML)."""
    if is_challenge(tree):
        return EngineOutcome.challenge("anomaly page (challenge-form)")
    links = tree.css_first("#links")
    blocks = tree.css("div.result")
    if links is None and not blocks:
        return EngineOutcome.unrecognised("no #links container")
    rows: list[RawRow] = []
    saw_end_block = False
    for block in blocks:
        classes = (block.attributes.get("class") or "").split()
        if "result--no-result" in classes:
            saw_end_block = True
            continue
        anchor = block.css_first("h2 a") or block.css_first("a.result__a")
        href = (anchor.attributes.get("href") or "").strip() if anchor is not None else ""
        title = node_text(anchor)
        if not href or not title:
            continue
        sponsored = (
            "result--ad" in classes
            or block.css_first(".badge--ad") is not None
            or href.startswith(("https://duckduckgo.com/y.js", "//duckduckgo.com/y.js"))
        )
        if href.startswith(_PSEUDO_RESULT_PREFIXES):
            continue
        snippet = node_text(block.css_first(".result__snippet"))
        rows.append(RawRow(title=title, url=href, snippet=snippet, sponsored=sponsored))
    if any(not row.sponsored for row in rows):
        return EngineOutcome.results(rows)
    if saw_end_block or tree.css_first("div.no-results") is not None:
        return EngineOutcome.no_results("no-results block")
    if rows:
        # Only ads: the page was read, it just holds nothing an agent may have.
        return EngineOutcome.results(rows)
    if links is not None and not links.css("div"):
        return EngineOutcome.no_results("empty #links")
    return EngineOutcome.unrecognised("no result blocks")


def parse(reply: EngineReply) -> EngineOutcome:
    from selectolax.lexbor import LexborHTMLParser  # noqa: PLC0415 - lexbor loads with the first HTML page

    tree = LexborHTMLParser(reply.text())
    # The challenge page comes back as HTTP 202 (or 403): read it before trusting the status.
    if is_challenge(tree):
        return EngineOutcome.challenge(f"anomaly page (HTTP {reply.status})")
    if reply.status == 202:
        return EngineOutcome.challenge("HTTP 202 (DuckDuckGo's rate-limit answer)")
    failed = status_outcome(reply)
    if failed is not None:
        return failed
    return parse_results_page(tree)


ENGINE = EngineSpec(
    name=NAME,
    tier="free",
    needs_key=False,
    default_url=DEFAULT_URL,
    build_request=build_request,
    parse=parse,
)
