"""Normalisation shared by every engine: raw rows in, safe plain-text results out.

Owns the rules of issue 4 that must not depend on which engine answered: ads and sponsored rows
dropped, redirect wrappers decoded before a link is judged, unsafe links dropped, the site
restriction enforced on hostnames, duplicates removed after URL normalisation, titles and snippets
as plain text, and the cut at max_results with `truncated`. Pure; never opens a socket.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from gateway.tools.search.engine import RawRow
from gateway.tools.search.links import (
    dedupe_key,
    host_of,
    on_site,
    strip_tracking,
    unsafe_reason,
    unwrap_redirect,
)

MAX_TITLE_CHARS = 300
MAX_SNIPPET_CHARS = 1_000

_TAG_RE = re.compile(r"<[^>]*>")
# Control characters and bidi/zero-width formatting can hide or reorder text an agent reads.
# Zero-width characters only: controls, bidi overrides and tag characters are removed (and
# counted) from every result at the tool's edge (gateway/tools/terminal_safe.py).
_INVISIBLE_RE = re.compile("[\u200b-\u200f\u2060-\u2064\ufeff]")
# Ad networks' click endpoints: a row linking there is an ad whatever the page called it.
_AD_URL_PREFIXES = (
    "https://duckduckgo.com/y.js",
    "http://duckduckgo.com/y.js",
    "https://www.bing.com/aclick",
    "https://bing.com/aclick",
    "https://www.googleadservices.com/",
    "https://googleads.g.doubleclick.net/",
)


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One result as handed to an agent."""

    title: str
    url: str
    snippet: str

    def to_json(self) -> dict[str, str]:
        return {"title": self.title, "url": self.url, "snippet": self.snippet}


@dataclass(frozen=True, slots=True)
class NormalisedRows:
    hits: tuple[SearchHit, ...]
    truncated: bool
    dropped: int


def plain_text(text: str, limit: int) -> str:
    """Markup-free text: tags stripped, entities decoded (twice-escaped ones too), whitespace
    collapsed, invisible and control characters removed, cut at `limit` characters."""
    stripped = _TAG_RE.sub(" ", text)
    decoded = html.unescape(html.unescape(stripped))
    # Decoding can reveal `&lt;b&gt;`-escaped markup some APIs send; strip it once more.
    decoded = _TAG_RE.sub(" ", decoded)
    flat = " ".join(_INVISIBLE_RE.sub(" ", decoded).split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _tidy_inline(text: str) -> str:
    # Inline highlight tags (<b>, <strong>, <em>) sit inside words; stripping them must not leave a
    # space before punctuation ("Eino :" from "<b>Eino</b>:").
    return re.sub(r"\s+([,.;:!?)\]])", r"\1", text)


def normalise_rows(rows: list[RawRow] | tuple[RawRow, ...], *, max_results: int, site: str | None) -> NormalisedRows:
    """Apply every rule in order; rows that survive keep the engine's ranking."""
    hits: list[SearchHit] = []
    seen: set[str] = set()
    dropped = 0
    truncated = False
    for row in rows:
        url = unwrap_redirect(row.url)
        if row.sponsored or url.startswith(_AD_URL_PREFIXES):
            dropped += 1
            continue
        if unsafe_reason(url) is not None:
            dropped += 1
            continue
        url = strip_tracking(url)
        if site is not None and not on_site(url, site):
            dropped += 1
            continue
        key = dedupe_key(url)
        if key in seen:
            dropped += 1
            continue
        seen.add(key)
        if len(hits) >= max_results:
            truncated = True
            break
        title = _tidy_inline(plain_text(row.title, MAX_TITLE_CHARS)) or host_of(url)
        snippet = _tidy_inline(plain_text(row.snippet, MAX_SNIPPET_CHARS))
        hits.append(SearchHit(title=title, url=url, snippet=snippet))
    return NormalisedRows(hits=tuple(hits), truncated=truncated, dropped=dropped)
