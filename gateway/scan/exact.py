"""Tier 1: exact values (held secrets and their placeholders) found in one pass by Aho-Corasick.

`ExactNeedles` is an immutable automaton (`ahocorasick_rs.BytesAhoCorasick`, the Rust
aho-corasick crate: bytes in, a SIMD prefilter on rare bytes) over the values, each tagged with
the credential it belongs to and whether it is the real value or the placeholder. Chosen over
pyahocorasick, whose wheels match `str` only (a Latin-1 copy of every body) and which read a
64 KiB body in about 1.1 ms against this one's few microseconds in the same run
(`bench/scan.py`). A lower-cased automaton of the placeholders serves DNS names, which are
compared without case. Never logs or returns a value: a hit is (credential name, kind, start, end).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ahocorasick_rs import BytesAhoCorasick

NeedleKind = Literal["placeholder", "value"]
# A real value shorter than this would match ordinary text: it is not scanned for (the store
# logs the credential's name once).
MIN_VALUE_CHARS = 8


@dataclass(frozen=True, slots=True)
class ExactHit:
    credential: str
    kind: NeedleKind
    start: int
    end: int


class _Automaton:
    __slots__ = ("_automaton", "_tags")

    def __init__(self, needles: list[tuple[bytes, str, NeedleKind]]) -> None:
        # Two credentials with one value: the first listed names it.
        unique: dict[bytes, tuple[str, NeedleKind]] = {}
        for text, credential, kind in needles:
            unique.setdefault(text, (credential, kind))
        self._tags = list(unique.values())
        self._automaton = BytesAhoCorasick(list(unique))

    def find(self, data: bytes) -> list[tuple[str, NeedleKind, int, int]]:
        return [
            (*self._tags[index], start, end)
            for index, start, end in self._automaton.find_matches_as_indexes(data, overlapping=True)
        ]


class ExactNeedles:
    """The automata over every held value and placeholder of one snapshot of the store."""

    __slots__ = ("_dns", "_main", "max_length")

    def __init__(self, values: list[tuple[str, bytes]], placeholders: list[tuple[str, str]]) -> None:
        needles: list[tuple[bytes, str, NeedleKind]] = [
            (value, name, "value") for name, value in values if len(value) >= MIN_VALUE_CHARS
        ]
        needles += [(placeholder.encode(), name, "placeholder") for name, placeholder in placeholders]
        self._main = _Automaton(needles) if needles else None
        lowered: list[tuple[bytes, str, NeedleKind]] = [
            (p.lower().encode(), name, "placeholder") for name, p in placeholders
        ]
        self._dns = _Automaton(lowered) if lowered else None
        self.max_length = max((len(text) for text, _, _ in needles), default=0)

    @property
    def empty(self) -> bool:
        return self._main is None

    def find(self, data: bytes, start: int = 0) -> list[ExactHit]:
        """Every hit ending after `start` (earlier ones were reported by the previous call of a
        streaming scan)."""
        if self._main is None:
            return []
        return [
            ExactHit(credential, kind, begin, end)
            for credential, kind, begin, end in self._main.find(data)
            if end > start
        ]

    def find_in_dns_name(self, name: str) -> list[str]:
        """Credentials whose placeholder a DNS name carries, in any case and across labels (an
        agent can split a placeholder with dots: `egph_abc.def.attacker.example`)."""
        if self._dns is None:
            return []
        joined = name.lower().replace(".", "").encode("utf-8", "surrogateescape")
        return sorted({credential for credential, _, _, _ in self._dns.find(joined)})
