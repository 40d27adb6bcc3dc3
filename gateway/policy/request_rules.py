"""Request rules for inspected hosts: the `inspect:` entries' values and the globs they match.

Owns what a rule *is* (methods, path globs, query and header matchers, its id and line) and how
one rule matches one request's facts. Path globs are anchored and matched segment by segment:
`*` and `?` stay inside one segment, a `**` segment matches zero or more whole segments. Every
matcher runs in time linear-ish in the input (a greedy wildcard walk, a segment table): paths
come from agents and are hostile. Never parses YAML, never touches a socket; the decision over a
whole entry is `inspect_decide.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Access = Literal["read-only", "read-write", "full"]
InspectMode = Literal["enforce", "report"]
# Methods each preset lets through. `full` is every method (None: no method test at all).
PRESET_METHODS: Mapping[str, frozenset[str] | None] = MappingProxyType(
    {
        "read-only": frozenset({"GET", "HEAD", "OPTIONS"}),
        "read-write": frozenset({"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"}),
        "full": None,
    }
)
# The methods `policy lint --diff` walks when it says what a change opens or closes.
KNOWN_METHODS: tuple[str, ...] = ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE")
DEFAULT_TLS_PORT = 443
DEFAULT_PLAIN_PORT = 80


def wildcard_match(pattern: str, text: str) -> bool:
    """`*` any run of characters, `?` one character, everything else literal; whole text.

    The greedy walk with one back-track point: O(len(pattern) * len(text)) at worst, never the
    exponential back-tracking a regex of several `.*` can fall into on hostile input.
    """
    p = t = 0
    star = -1
    mark = 0
    while t < len(text):
        if p < len(pattern) and (pattern[p] == "?" or pattern[p] == text[t]):
            p += 1
            t += 1
        elif p < len(pattern) and pattern[p] == "*":
            star, mark = p, t
            p += 1
        elif star >= 0:
            p = star + 1
            mark += 1
            t = mark
        else:
            return False
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


@dataclass(frozen=True, slots=True)
class PathGlob:
    """An anchored path glob, kept as text (what audit and lint print) and as its segments."""

    text: str
    segments: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> PathGlob:
        """Raise ValueError for a glob that is not `/...` or has `**` inside a segment."""
        if text.startswith("**"):
            text = "/" + text
        if not text.startswith("/"):
            raise ValueError("a path glob starts with '/' (or '**/')")
        segments = tuple(text[1:].split("/"))
        for segment in segments:
            if "**" in segment and segment != "**":
                raise ValueError("'**' must be a whole segment ('/a/**/b'), '*' stays inside one")
            if segment in (".", ".."):
                raise ValueError("a path glob has no '.' or '..' segment (such requests are refused)")
        return cls(text, segments)

    @property
    def literal(self) -> bool:
        return not any("*" in s or "?" in s for s in self.segments)

    def matches(self, path_segments: Sequence[str]) -> bool:
        """Whether the decoded path's segments match; a table over (glob, path) positions."""
        globs = self.segments
        # reachable[j]: the first i glob segments can consume the first j path segments.
        reachable = [False] * (len(path_segments) + 1)
        reachable[0] = True
        for glob in globs:
            following = [False] * (len(path_segments) + 1)
            if glob == "**":
                seen = False
                for j in range(len(path_segments) + 1):
                    seen = seen or reachable[j]
                    following[j] = seen
            else:
                for j, path_segment in enumerate(path_segments):
                    if reachable[j] and wildcard_match(glob, path_segment):
                        following[j + 1] = True
            reachable = following
            if not any(reachable):
                return False
        return reachable[len(path_segments)]


@dataclass(frozen=True, slots=True)
class ValueMatcher:
    """A query parameter or header test: present (True), absent (False), or a value glob."""

    name: str
    present: bool = True
    glob: str | None = None

    def describe(self) -> str:
        if self.glob is not None:
            return f"{self.name}={self.glob}"
        return self.name if self.present else f"!{self.name}"

    def matches(self, values: Sequence[str], *, every: bool) -> bool:
        """Whether the values this request carries under the name pass the test.

        With several values, an allow rule wants `every` one to match (an agent cannot slip a
        second `ref=` past it) and a deny rule fires on any one.
        """
        if self.glob is None:
            return bool(values) == self.present
        if not values:
            return False
        glob = self.glob
        if every:
            return all(wildcard_match(glob, value) for value in values)
        return any(wildcard_match(glob, value) for value in values)


@dataclass(frozen=True, slots=True)
class RequestRule:
    """One `allow` or `deny` rule (or an entry's `access` preset, which is one allow rule)."""

    rule_id: str
    line: int
    methods: frozenset[str] | None = None  # None: any method
    paths: tuple[PathGlob, ...] = ()  # empty: any path
    query: tuple[ValueMatcher, ...] = ()
    headers: tuple[ValueMatcher, ...] = ()

    def method_matches(self, method: str) -> bool:
        return self.methods is None or method in self.methods

    def path_matches(self, segments: Sequence[str]) -> bool:
        return not self.paths or any(glob.matches(segments) for glob in self.paths)

    def extras_match(self, query: dict[str, list[str]], headers: dict[str, list[str]], *, every: bool) -> bool:
        return all(m.matches(query.get(m.name, []), every=every) for m in self.query) and all(
            m.matches(headers.get(m.name, []), every=every) for m in self.headers
        )

    def describe(self) -> str:
        methods = ",".join(sorted(self.methods)) if self.methods is not None else "*"
        paths = " ".join(g.text for g in self.paths) or "/**"
        extras = [m.describe() for m in (*self.query, *self.headers)]
        return f"{methods} {paths}" + (f" [{' '.join(extras)}]" if extras else "")


@dataclass(frozen=True, slots=True)
class InspectEntry:
    """One `inspect:` entry: a host glob, its ports, and the rules requests to it are judged by."""

    entry_id: str  # `inspect[0]` or `defaults.inspect[1]`
    host: str  # a normalised domain glob (`api.github.com`, `*.example.org`, `*`)
    line: int
    ports: tuple[int, ...] = ()  # empty: 443 for TLS, 80 for plain HTTP
    allow: tuple[RequestRule, ...] = ()
    deny: tuple[RequestRule, ...] = ()
    mode: InspectMode | None = None  # overrides the principal's and the defaults' mode for this host

    def port_matches(self, port: int, *, tls: bool) -> bool:
        if self.ports:
            return port in self.ports
        return port == (DEFAULT_TLS_PORT if tls else DEFAULT_PLAIN_PORT)
