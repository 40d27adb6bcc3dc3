"""Tavily's search API (`POST api.tavily.com/search`, bearer key), asked and read.

Owns the JSON body (max_results, include_domains for the site, time_range) and the reading of
`results[].{title,url,content}`. Region is not sent: Tavily's `country` wants full country names
and only boosts, so it would promise a restriction it does not keep. Pure; never opens a socket.
"""

from __future__ import annotations

import datetime as dt
from types import MappingProxyType

import orjson

from gateway.tools.search.engine import (
    API_USER_AGENT,
    EngineOutcome,
    EngineSpec,
    rows_from_results_array,
)
from gateway.tools.search.query import SearchQuery
from gateway.tools.search.transport import EngineReply, EngineRequest

NAME = "tavily"
DEFAULT_URL = "https://api.tavily.com/search"
_TIME_RANGES = MappingProxyType({"d": "day", "w": "week", "m": "month", "y": "year"})


def build_request(query: SearchQuery, key: str | None, base_url: str, *, today: dt.date) -> EngineRequest:
    del today
    body: dict[str, object] = {
        "query": query.query,
        "max_results": query.max_results,
        "search_depth": "basic",
        "topic": "general",
        "include_answer": False,
        "include_raw_content": False,
        "include_images": False,
    }
    if query.site:
        body["include_domains"] = [query.site]
    if query.time_range:
        body["time_range"] = _TIME_RANGES[query.time_range]
    headers = (
        ("Authorization", f"Bearer {key or ''}"),
        ("Content-Type", "application/json"),
        ("Accept", "application/json"),
        ("User-Agent", API_USER_AGENT),
    )
    return EngineRequest("POST", base_url, headers, orjson.dumps(body))


def parse(reply: EngineReply) -> EngineOutcome:
    return rows_from_results_array(reply, lambda item: str(item.get("content") or ""))


ENGINE = EngineSpec(
    name=NAME,
    tier="keyed",
    needs_key=True,
    default_url=DEFAULT_URL,
    build_request=build_request,
    parse=parse,
)
