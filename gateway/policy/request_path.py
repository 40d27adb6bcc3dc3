"""A request target, checked and split into what request rules match: decoded path segments and
query parameters.

Owns the refusals that keep a path glob honest: a `.` or `..` segment (plain or encoded: an
origin may resolve `/public/../admin` after the gateway matched `/public/**`), an encoded `/` or
`\\` (one segment to the gateway, two to some origins), `%00`, an empty segment (`//admin`,
which origins that collapse slashes read as `/admin`), invalid percent-encoding and a decoded
path that is not UTF-8. Each is `unsafe_url`. Pure: strings in, values or a GatewayError out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from gateway.errors import ErrorCode, GatewayError

# `%` not followed by two hex digits.
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
# Encoded characters whose decoding changes how a path splits or ends.
_SPLITTING_ESCAPES = re.compile(r"%(?:2[Ff]|5[Cc]|00)")
MAX_QUERY_PARAMETERS = 256


@dataclass(frozen=True, slots=True)
class RequestPath:
    """The path part of a target, its decoded segments, and its query parameters by name."""

    path: str  # as sent, without the query: what the audit line shows
    segments: tuple[str, ...]
    query: dict[str, list[str]]


def _unsafe(reason: str) -> GatewayError:
    return GatewayError(ErrorCode.UNSAFE_URL, f"request path refused: {reason}")


def _decode(text: str, what: str) -> str:
    try:
        return unquote(text, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise _unsafe(f"the {what} is not UTF-8 once decoded") from None


def parse_query(query: str) -> dict[str, list[str]]:
    """Parameters by decoded name; `a&a=1` gives `{"a": ["", "1"]}`; `+` is a space (forms)."""
    params: dict[str, list[str]] = {}
    if not query:
        return params
    pieces = query.split("&")
    if len(pieces) > MAX_QUERY_PARAMETERS:
        raise _unsafe(f"more than {MAX_QUERY_PARAMETERS} query parameters")
    for piece in pieces:
        if not piece:
            continue
        name, _, value = piece.partition("=")
        if _BAD_PERCENT.search(piece):
            raise _unsafe("invalid percent-encoding in the query")
        params.setdefault(_decode(name.replace("+", " "), "query"), []).append(
            _decode(value.replace("+", " "), "query")
        )
    return params


def split_target(target: str) -> RequestPath:
    """Check an origin-form target (`/a/b?c=d`) and split it; `*` (OPTIONS) is the empty path."""
    path, _, query = target.partition("?")
    path = path.partition("#")[0]
    if path == "*":
        return RequestPath("*", (), parse_query(query))
    if not path.startswith("/"):
        raise _unsafe("the path does not start with '/'")
    if "\\" in path:
        raise _unsafe("a backslash in the path")
    if _BAD_PERCENT.search(path):
        raise _unsafe("invalid percent-encoding in the path")
    if _SPLITTING_ESCAPES.search(path):
        raise _unsafe("an encoded '/', '\\' or NUL in the path")
    raw_segments = path[1:].split("/")
    segments: list[str] = []
    for index, raw in enumerate(raw_segments):
        segment = _decode(raw, "path")
        if segment in (".", ".."):
            raise _unsafe("a '.' or '..' segment")
        # A trailing slash is an empty last segment and means something to origins; an empty
        # segment anywhere else is `//`.
        if not segment and index != len(raw_segments) - 1:
            raise _unsafe("an empty path segment ('//')")
        segments.append(segment)
    return RequestPath(path, tuple(segments), parse_query(query))
