"""The search arguments: the validated `SearchQuery` value and the API argument parser.

Owns the exact rules of the web_search API arguments (issue 4): what is accepted, what is refused
and with which message. Pure: no I/O, no engine knowledge.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.schemas import (
    SEARCH_DEFAULT_RESULTS,
    SEARCH_MAX_QUERY_CHARS,
    SEARCH_MAX_RESULTS,
    SEARCH_MAX_SITE_CHARS,
    SEARCH_MIN_RESULTS,
    SEARCH_TIME_RANGES,
    argument_names,
)
from gateway.tools.search.links import NON_PUBLIC_SUFFIXES
from gateway.vet.urls import vet_host

TimeRange = Literal["d", "w", "m", "y"]

# The arguments are declared once, in gateway.tools.schemas (the MCP, OpenAPI and /v1/tools source).
MAX_QUERY_CHARS = SEARCH_MAX_QUERY_CHARS
MIN_RESULTS = SEARCH_MIN_RESULTS
MAX_RESULTS = SEARCH_MAX_RESULTS
DEFAULT_MAX_RESULTS = SEARCH_DEFAULT_RESULTS
MAX_DOMAIN_CHARS = SEARCH_MAX_SITE_CHARS

_ALLOWED_FIELDS = argument_names("search")
_TIME_RANGES: tuple[TimeRange, ...] = SEARCH_TIME_RANGES
_REGION_RE = re.compile(r"[a-z]{2}-[a-z]{2}")
_LABEL_RE = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """One validated search: what to ask and how many rows to hand back."""

    query: str
    max_results: int = DEFAULT_MAX_RESULTS
    site: str | None = None
    time_range: TimeRange | None = None
    region: str | None = None

    def with_site_operator(self) -> str:
        """The query text with `site:` appended, for engines whose only site filter is the query."""
        return f"{self.query} site:{self.site}" if self.site else self.query


def _invalid(field: str, reason: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_INPUT, f"{field}: {reason}", extra={"field": field})


def _has_forbidden_char(text: str) -> bool:
    # Control (Cc) characters break log lines and request lines; format (Cf) characters such as
    # U+202E or zero-width joiners hide text from the human reading the audit log.
    return any(unicodedata.category(ch) in ("Cc", "Cf") for ch in text)


def _parse_query(raw: object) -> str:
    if raw is None:
        raise _invalid("query", "is required")
    if not isinstance(raw, str):
        raise _invalid("query", "must be a string")
    text = raw.strip()
    if not text:
        raise _invalid("query", "must not be empty")
    if len(text) > MAX_QUERY_CHARS:
        raise _invalid("query", f"must be at most {MAX_QUERY_CHARS} characters")
    if _has_forbidden_char(text):
        raise _invalid("query", "must not contain control or format characters")
    return text


def _parse_max_results(raw: object) -> int:
    # bool is an int subclass; `true` is not a count.
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _invalid("maxResults", "must be an integer")
    if not MIN_RESULTS <= raw <= MAX_RESULTS:
        raise _invalid("maxResults", f"must be between {MIN_RESULTS} and {MAX_RESULTS}")
    return raw


def parse_site(raw: object) -> str:
    """A public domain name, lowercased and IDNA-encoded: no scheme, path, port or wildcard."""
    if not isinstance(raw, str):
        raise _invalid("site", "must be a string")
    name = raw.strip().lower().rstrip(".")
    if not name:
        raise _invalid("site", "must not be empty")
    if "://" in name or "/" in name or "?" in name or "#" in name:
        raise _invalid("site", "must be a domain name without scheme or path")
    if "*" in name:
        raise _invalid("site", "must not contain a wildcard")
    if "@" in name:
        raise _invalid("site", "must not contain userinfo")
    if ":" in name and not name.startswith("["):
        raise _invalid("site", "must not contain a port")
    if _has_forbidden_char(name):
        raise _invalid("site", "must not contain control or format characters")
    try:
        host = vet_host(name)
    except GatewayError as exc:
        raise _invalid("site", f"must be a public domain ({exc.message})") from None
    if host.ip is not None:
        raise _invalid("site", "must be a domain name, not an IP address")
    if any(host.name == s or host.name.endswith("." + s) for s in NON_PUBLIC_SUFFIXES):
        raise _invalid("site", "must be a public domain")
    return host.name


def parse_search_args(payload: Mapping[str, object]) -> SearchQuery:
    """Validate the API arguments of web_search exactly; raise invalid_input naming the field."""
    for field in payload:
        if field not in _ALLOWED_FIELDS:
            raise _invalid(str(field), "unknown field")
    query = _parse_query(payload.get("query"))
    max_results = DEFAULT_MAX_RESULTS
    if payload.get("maxResults") is not None:
        max_results = _parse_max_results(payload["maxResults"])
    site = None
    if payload.get("site") is not None:
        site = parse_site(payload["site"])
    time_range: TimeRange | None = None
    raw_range = payload.get("timeRange")
    if raw_range is not None:
        if raw_range not in _TIME_RANGES:
            raise _invalid("timeRange", "must be one of d, w, m, y")
        time_range = raw_range
    region = None
    raw_region = payload.get("region")
    if raw_region is not None:
        if not isinstance(raw_region, str) or not _REGION_RE.fullmatch(raw_region.lower()):
            raise _invalid("region", "must look like us-en or wt-wt")
        region = raw_region.lower()
    return SearchQuery(query=query, max_results=max_results, site=site, time_range=time_range, region=region)
