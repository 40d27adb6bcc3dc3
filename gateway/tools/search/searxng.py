"""A SearXNG instance's JSON API (`<instance>/search?format=json`), asked and read.

Owns the query parameters (time_range, language from region, `site:` in q) and the reading of
`results[].{title,url,content}`. An instance with the JSON format disabled answers 403, reported as
a refusal. There is no public default: the instance URL comes from EGRESS_SEARCH_SEARXNG_URL.
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
    rows_from_results_array,
)
from gateway.tools.search.query import SearchQuery
from gateway.tools.search.transport import EngineReply, EngineRequest

NAME = "searxng"
DEFAULT_URL = ""
_TIME_RANGES = MappingProxyType({"d": "day", "w": "week", "m": "month", "y": "year"})


def search_endpoint(base_url: str) -> str:
    """The instance's /search endpoint, whether the setting names the instance or the endpoint."""
    trimmed = base_url.rstrip("/")
    return trimmed if trimmed.endswith("/search") else trimmed + "/search"


def build_request(query: SearchQuery, key: str | None, base_url: str, *, today: dt.date) -> EngineRequest:
    del key, today
    params: list[tuple[str, str]] = [
        ("q", query.with_site_operator()),
        ("format", "json"),
        ("pageno", "1"),
    ]
    if query.time_range:
        params.append(("time_range", _TIME_RANGES[query.time_range]))
    if query.region and not query.region.startswith("wt-"):
        country, language = query.region.split("-")
        params.append(("language", f"{language}-{country.upper()}"))
    headers = (("Accept", "application/json"), ("User-Agent", API_USER_AGENT))
    return EngineRequest("GET", f"{search_endpoint(base_url)}?{urlencode(params)}", headers, None)


def parse(reply: EngineReply) -> EngineOutcome:
    return rows_from_results_array(reply, lambda item: str(item.get("content") or ""))


ENGINE = EngineSpec(
    name=NAME,
    tier="configured",
    needs_key=False,
    default_url=DEFAULT_URL,
    build_request=build_request,
    parse=parse,
)
