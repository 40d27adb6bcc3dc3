"""The Brave Search API (`GET api.search.brave.com/res/v1/web/search`, `X-Subscription-Token`).

Owns the query parameters (count, freshness, country and search_lang from region, plain-text
decorations off, `site:` in q) and the reading of `web.results[].{title,url,description}`.
Pure; never opens a socket.
"""

from __future__ import annotations

import datetime as dt
from types import MappingProxyType
from urllib.parse import urlencode

from gateway.tools.search.engine import (
    API_USER_AGENT,
    EngineOutcome,
    EngineSpec,
    load_json,
    rows_from_items,
    status_outcome,
)
from gateway.tools.search.query import SearchQuery
from gateway.tools.search.transport import EngineReply, EngineRequest

NAME = "brave_api"
DEFAULT_URL = "https://api.search.brave.com/res/v1/web/search"
_FRESHNESS = MappingProxyType({"d": "pd", "w": "pw", "m": "pm", "y": "py"})


def build_request(query: SearchQuery, key: str | None, base_url: str, *, today: dt.date) -> EngineRequest:
    del today  # freshness is relative
    params: list[tuple[str, str]] = [
        ("q", query.with_site_operator()),
        ("count", str(query.max_results)),
        ("text_decorations", "false"),
        ("result_filter", "web"),
    ]
    if query.time_range:
        params.append(("freshness", _FRESHNESS[query.time_range]))
    if query.region and not query.region.startswith("wt-"):
        country, language = query.region.split("-")
        params += [("country", country.upper()), ("search_lang", language)]
    headers = (
        ("X-Subscription-Token", key or ""),
        ("Accept", "application/json"),
        ("User-Agent", API_USER_AGENT),
    )
    return EngineRequest("GET", f"{base_url}?{urlencode(params)}", headers, None)


def parse(reply: EngineReply) -> EngineOutcome:
    failed = status_outcome(reply)
    if failed is not None:
        return failed
    data = load_json(reply)
    if not isinstance(data, dict) or ("type" not in data and "web" not in data):
        return EngineOutcome.unrecognised("not a Brave API answer")
    web = data.get("web")
    if web is None:
        # A search answer with no `web` section is Brave's way to say nothing matched.
        return EngineOutcome.no_results("no web section")
    results = web.get("results") if isinstance(web, dict) else None
    if not isinstance(results, list):
        return EngineOutcome.unrecognised("web.results is not a list")
    return rows_from_items(results, lambda item: str(item.get("description") or ""), empty="empty web.results")


ENGINE = EngineSpec(
    name=NAME,
    tier="keyed",
    needs_key=True,
    default_url=DEFAULT_URL,
    build_request=build_request,
    parse=parse,
)
