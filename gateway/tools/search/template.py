"""The template engine: any search endpoint named by EGRESS_SEARCH_URL, read whatever its shape.

Owns filling the URL template (`{query}`, `{limit}`; without `{query}` the query is added as `q=`),
the optional bearer key (EGRESS_SEARCH_KEY), and reading the answer: JSON is searched for the first
array of objects naming an address (url/link/href with title/name and
content/description/snippet), HTML is read like DuckDuckGo's page, plain text is handed over as
written (one row per line holding a link, or one row for the whole text). Pure; never opens a
socket.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from urllib.parse import quote, urlsplit, urlunsplit

from gateway.tools.search.duckduckgo import parse_results_page
from gateway.tools.search.engine import (
    API_USER_AGENT,
    EngineOutcome,
    EngineSpec,
    RawRow,
    load_json,
    status_outcome,
)
from gateway.tools.search.query import SearchQuery
from gateway.tools.search.transport import EngineReply, EngineRequest

NAME = "template"
DEFAULT_URL = ""
MAX_JSON_DEPTH = 8
MAX_TEXT_SNIPPET_CHARS = 1_000
_URL_KEYS = ("url", "link", "href")
_TITLE_KEYS = ("title", "name")
_SNIPPET_KEYS = ("content", "description", "snippet", "summary", "text")
_LINK_IN_TEXT_RE = re.compile(r"https?://[^\s<>\"')\]]+")


def fill_template(template: str, query: SearchQuery) -> str:
    """The request URL: placeholders filled with percent-encoded values, or `q=` appended."""
    text = query.with_site_operator()
    if "{query}" in template:
        url = template.replace("{query}", quote(text, safe="")).replace("{limit}", str(query.max_results))
        return url
    url = template.replace("{limit}", str(query.max_results))
    parts = urlsplit(url)
    extra = f"q={quote(text, safe='')}"
    joined = f"{parts.query}&{extra}" if parts.query else extra
    return urlunsplit(parts._replace(query=joined))


def build_request(query: SearchQuery, key: str | None, base_url: str, *, today: dt.date) -> EngineRequest:
    del today
    headers: list[tuple[str, str]] = [
        ("Accept", "application/json, text/html;q=0.9, text/plain;q=0.8"),
        ("User-Agent", API_USER_AGENT),
    ]
    if key:
        headers.append(("Authorization", f"Bearer {key}"))
    return EngineRequest("GET", fill_template(base_url, query), tuple(headers), None)


def _first_string(item: dict[str, object], keys: tuple[str, ...]) -> str:
    for key in keys:
        value = item.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return ""


def _names_address(item: object) -> bool:
    return isinstance(item, dict) and bool(_first_string(item, _URL_KEYS)) and bool(_first_string(item, _TITLE_KEYS))


def _arrays(value: object, depth: int = 0) -> Iterator[list[object]]:
    # Breadth matters less than document order: the first array met is the main one in every
    # API seen (results, items, data.hits, web.results).
    if depth > MAX_JSON_DEPTH:
        return
    if isinstance(value, list):
        yield value
        for item in value:
            yield from _arrays(item, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _arrays(item, depth + 1)


def rows_from_json(data: object) -> list[RawRow] | None:
    """Rows from the first array of objects naming an address, or None when there is none."""
    for array in _arrays(data):
        if any(_names_address(item) for item in array):
            return [
                RawRow(
                    title=_first_string(item, _TITLE_KEYS),
                    url=_first_string(item, _URL_KEYS),
                    snippet=_first_string(item, _SNIPPET_KEYS),
                )
                for item in array
                if isinstance(item, dict) and _names_address(item)
            ]
    return None


def rows_from_text(text: str, source_url: str) -> list[RawRow]:
    rows: list[RawRow] = []
    for line in text.splitlines():
        match = _LINK_IN_TEXT_RE.search(line)
        if match:
            title = line[: match.start()].strip(" -:|\t") or match.group(0)
            snippet = line[match.end() :].strip()
            rows.append(RawRow(title=title, url=match.group(0), snippet=snippet))
    if rows:
        return rows
    flat = " ".join(text.split())
    if not flat:
        return []
    return [RawRow(title=flat[:120], url=source_url, snippet=flat[:MAX_TEXT_SNIPPET_CHARS])]


def parse(reply: EngineReply) -> EngineOutcome:
    failed = status_outcome(reply)
    if failed is not None:
        return failed
    stripped = reply.body.lstrip()
    if reply.content_type.endswith("json") or stripped[:1] in (b"{", b"["):
        data = load_json(reply)
        if data is not None:
            rows = rows_from_json(data)
            if rows is None:
                return EngineOutcome.unrecognised("JSON without an array of linked objects")
            return EngineOutcome.results(rows) if rows else EngineOutcome.no_results("empty array")
    if reply.content_type in ("text/html", "application/xhtml+xml") or stripped[:1] == b"<":
        from selectolax.lexbor import LexborHTMLParser  # noqa: PLC0415 - lexbor loads with the first HTML page

        return parse_results_page(LexborHTMLParser(reply.text()))
    rows = rows_from_text(reply.text(), reply.url)
    return EngineOutcome.results(rows) if rows else EngineOutcome.no_results("empty body")


ENGINE = EngineSpec(
    name=NAME,
    tier="configured",
    needs_key=False,
    default_url=DEFAULT_URL,
    build_request=build_request,
    parse=parse,
)
