"""What HTML → markdown accumulates: the text written so far, under a cap, and the links kept.

`MarkdownWriter` owns paragraph and block spacing, list and quote prefixes, the output cap and
the dropping of headings left with nothing under them (a "Contents" heading whose list was
chrome); `LinkCollector` resolves link targets against the page's base URL and keeps the first
few absolute http(s) links; `LinkReferences` numbers URLs for the `links: references` style.
Pure; never touches the network.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

DEAD_SCHEMES = ("javascript:", "data:", "vbscript:", "about:")
WHITESPACE = re.compile(r"[ \t\n\r\f\v]+")
# What the fast path of `LinkCollector.resolve` leaves to urljoin: tabs and newlines to strip,
# backslashes and dot segments to normalise.
NEEDS_NORMALISING = re.compile(r"[\t\n\r\\]|/\.")
# What a dropped edit link leaves in a heading of "[edit]" or "[edit | edit source]".
EMPTY_BRACKETS = re.compile(r"\[[\s|]*\]")


@dataclass(frozen=True, slots=True)
class Link:
    text: str
    url: str


class OutputFull(Exception):
    """Raised inside the walk when max_chars is reached; never leaves this module."""


@dataclass(slots=True)
class Container:
    """A list item or quote whose prefix starts each line of the blocks inside it."""

    first_prefix: str
    rest_prefix: str
    started: bool = False


# Compared by identity: two adjacent lists with equal fields are still two lists.
@dataclass(slots=True, eq=False)
class ListState:
    ordered: bool
    next_number: int


@dataclass(slots=True)
class LinkCollector:
    base_url: str
    max_links: int
    links: list[Link] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    origin: str = ""  # scheme://host of base_url, for the root-relative fast path
    document: str = ""  # base_url without its fragment, for the in-page fast path

    def __post_init__(self) -> None:
        try:
            parts = urlsplit(self.base_url)
        except ValueError:
            return
        if parts.scheme in ("http", "https") and parts.netloc:
            self.origin = f"{parts.scheme}://{parts.netloc}"
            self.document = self.base_url.partition("#")[0]

    def resolve(self, href: str | None) -> str | None:
        """Absolute URL for an href, or None when the link should keep only its words."""
        if href is None:
            return None
        cleaned = href.strip()
        # The links of most pages, in one scan each: root-relative, in-page and absolute web
        # links with nothing to normalise. A link starting with / or # names no scheme, so it
        # cannot be a dead one. Anything else takes the general path.
        if cleaned and NEEDS_NORMALISING.search(cleaned) is None:
            first = cleaned[0]
            if first == "/":
                if self.origin and cleaned[1:2] != "/":
                    return self.origin + cleaned
            elif first == "#":
                if self.document:
                    return self.document + cleaned
            elif cleaned[:8].lower().startswith(("http://", "https://")):
                return cleaned
        return self._resolve_any(cleaned)

    def _resolve_any(self, cleaned: str) -> str | None:
        # WHATWG URL parsing strips tabs and newlines inside an href.
        if "\t" in cleaned or "\n" in cleaned or "\r" in cleaned:
            cleaned = re.sub(r"[\t\n\r]", "", cleaned)
        lowered = cleaned[:12].lower()
        if not cleaned or lowered.startswith(DEAD_SCHEMES):
            return None
        # urljoin is slow: absolute, root-relative and in-page links (most links on most
        # pages) are resolved directly when nothing in them needs normalising.
        if "/." not in cleaned and "\\" not in cleaned:
            if lowered.startswith(("http://", "https://")):
                return cleaned
            if self.origin and cleaned[0] == "/" and cleaned[1:2] != "/":
                return self.origin + cleaned
            if self.document and cleaned[0] == "#":
                return self.document + cleaned
        try:
            absolute = urljoin(self.base_url, cleaned)
            urlsplit(absolute)
        except ValueError:
            return None
        return absolute

    def record(self, text: str, url: str) -> None:
        if len(self.links) >= self.max_links or url in self.seen:
            return
        if not url[:8].lower().startswith(("http://", "https://")):
            return
        self.seen.add(url)
        self.links.append(Link(text=text, url=url))


class MarkdownWriter:
    """Accumulates inline text and emits blocks with their list and quote prefixes."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.parts: list[str] = []
        self.length = 0
        self.inline: list[str] = []
        self.containers: list[Container] = []
        self.lists: list[ListState] = []
        # The lists open when the previous block was written: a new item continues them. The
        # states themselves, not their id()s: a closed list's id is reused by the next list's
        # state, which made two separate <ul>s render as one tight list, by allocator chance.
        self.last_block_lists: tuple[ListState, ...] = ()

        # Headings written since the last other block, as (index in parts, level): a heading
        # followed by one of the same or a higher level, or by the end, heads nothing.
        self.open_headings: list[tuple[int, int]] = []

    def text(self, value: str) -> None:
        self.inline.append(value)

    def inline_text(self) -> str:
        """The pending inline text, collapsed, and cleared (a heading's or a term's words)."""
        text = " ".join("".join(self.inline).split())
        self.inline.clear()
        if "[" in text:
            text = " ".join(EMPTY_BRACKETS.sub(" ", text).split())
        return text

    def heading(self, body: str, level: int) -> None:
        """A heading block; it is taken back if no content follows it before the next one."""
        if self.containers:
            self.block(body)
            return
        while self.open_headings and self.open_headings[-1][1] >= level:
            self._take_back(self.open_headings.pop()[0])
        index = len(self.parts)
        self.block(body)
        self.open_headings.append((index, level))

    def _take_back(self, index: int) -> None:
        self.length -= sum(len(piece) for piece in self.parts[index:])
        del self.parts[index:]

    def flush_paragraph(self) -> None:
        if not self.inline:
            return
        raw = "".join(self.inline)
        self.inline.clear()
        if "\n" in raw:
            # A <br> inside: each line is collapsed on its own and blank lines are dropped.
            lines = [" ".join(line.split()) for line in raw.split("\n")]
            body = "\n".join(line for line in lines if line)
        else:
            body = " ".join(raw.split())
        if body:
            self.block(body)

    def block(self, body: str, *, verbatim: bool = False) -> None:
        """Emit one block; `verbatim` keeps inner whitespace (fenced code)."""
        lists = tuple(self.lists)
        if self.open_headings:
            self.open_headings.clear()
        if not self.containers:
            # Outside list items and quotes (most blocks): no prefixes, one blank line before.
            if self.parts:
                self._append("\n\n")
            self.last_block_lists = lists
            self._append(body)
            return
        opening_item = any(not c.started for c in self.containers)
        continuing = "".join(c.rest_prefix for c in self.containers if c.started).rstrip()
        if self.parts:
            # Items of one list (and a sublist under its item's text) stay tight.
            same_list = bool(lists) and lists[-1] in self.last_block_lists
            sublist = len(lists) > 1 and lists[:-1] == self.last_block_lists
            tight = opening_item and (same_list or sublist)
            self._append("\n" if tight else f"\n{continuing}\n")
        lines = body.split("\n")
        out: list[str] = []
        for index, line in enumerate(lines):
            prefix = "".join(
                c.first_prefix if (index == 0 and not c.started) else c.rest_prefix for c in self.containers
            )
            out.append((prefix + line) if (line or not verbatim) else prefix.rstrip())
        for container in self.containers:
            container.started = True
        self.last_block_lists = lists
        self._append("\n".join(out))

    def _append(self, piece: str) -> None:
        self.parts.append(piece)
        self.length += len(piece)
        if self.length >= self.max_chars:
            raise OutputFull

    def markdown(self) -> str:
        if self.open_headings:
            self._take_back(self.open_headings[0][0])
            self.open_headings.clear()
        return "".join(self.parts)


class LinkReferences:
    """URLs numbered in order of first use, for `[words][n]` and the list at the end."""

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}

    def number(self, url: str) -> int:
        found = self.numbers.get(url)
        if found is None:
            found = self.numbers[url] = len(self.numbers) + 1
        return found

    def definitions(self, up_to: int) -> str:
        """The `[n]: url` lines of references 1..up_to."""
        return "\n".join(f"[{n}]: {url}" for url, n in self.numbers.items() if n <= up_to)
