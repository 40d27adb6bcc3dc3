"""A MediaWiki search API (`api.php?action=query&list=search`), asked and read.

Owns the query parameters and the reading of `query.search[].{title,snippet}`; each title becomes
the article URL on the same wiki (`/wiki/Title_With_Underscores`). Default endpoint English
Wikipedia. A wiki is one site, so time range and region do not apply, and a `site` restriction is
left to normalisation (a wiki outside it yields no rows). Pure; never opens a socket.
"""

from __future__ import annotations

import datetime as dt
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

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

NAME = "mediawiki"
DEFAULT_URL = "https://en.wikipedia.org/w/api.php"


def build_request(query: SearchQuery, key: str | None, base_url: str, *, today: dt.date) -> EngineRequest:
    del key, today
    params = [
        ("action", "query"),
        ("list", "search"),
        ("format", "json"),
        ("formatversion", "2"),
        ("utf8", "1"),
        ("srsearch", query.query),
        ("srlimit", str(query.max_results)),
        ("srprop", "snippet"),
    ]
    # Wikimedia's User-Agent policy asks for an identifying agent on API calls.
    headers = (("Accept", "application/json"), ("User-Agent", API_USER_AGENT))
    return EngineRequest("GET", f"{base_url}?{urlencode(params)}", headers, None)


def article_url(api_url: str, title: str) -> str:
    """`https://en.wikipedia.org/w/api.php` + `Ada Lovelace` → `.../wiki/Ada_Lovelace`."""
    parts = urlsplit(api_url)
    path = "/wiki/" + quote(title.replace(" ", "_"), safe="/:()_,'!-.~")
    return urlunsplit((parts.scheme or "https", parts.netloc, path, "", ""))


def parse(reply: EngineReply) -> EngineOutcome:
    failed = status_outcome(reply)
    if failed is not None:
        return failed
    data = load_json(reply)
    if not isinstance(data, dict):
        return EngineOutcome.unrecognised("not JSON")
    if isinstance(data.get("error"), dict):
        code = str(data["error"].get("code") or "error")
        if code == "maxlag":
            return EngineOutcome.challenge("maxlag")
        return EngineOutcome.refused(reply.status, f"API error {code}")
    block = data.get("query")
    search = block.get("search") if isinstance(block, dict) else None
    if not isinstance(search, list):
        return EngineOutcome.unrecognised("no query.search array")
    rows = [
        RawRow(
            title=str(item["title"]),
            url=article_url(reply.url, str(item["title"])),
            snippet=str(item.get("snippet") or ""),
        )
        for item in search
        if isinstance(item, dict)
        and item.get("title")
        # A redirect page's snippet is its #REDIRECT line, not text about the subject.
        and not str(item.get("snippet") or "").upper().startswith("#REDIRECT")
    ]
    return EngineOutcome.results(rows) if rows else EngineOutcome.no_results("empty search list")


ENGINE = EngineSpec(
    name=NAME,
    tier="configured",
    needs_key=False,
    default_url=DEFAULT_URL,
    build_request=build_request,
    parse=parse,
)
