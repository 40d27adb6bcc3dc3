"""Tier 1: exact values (held secrets and their placeholders) found in one pass by Aho-Corasick.

`ExactNeedles` is an immutable automaton (pyahocorasick) over the values, each tagged with the
credential it belongs to and whether it is the real value or the placeholder. pyahocorasick's
wheels match `str`, so bytes are read as Latin-1 (one character per byte: offsets are byte
offsets). A lower-cased automaton of the placeholders serves DNS names, which are compared
without case. Never logs or returns a value: a hit is (credential name, kind, start, end).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import ahocorasick

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


def _automaton(needles: list[tuple[str, str, NeedleKind]]) -> ahocorasick.Automaton | None:
    if not needles:
        return None
    automaton = ahocorasick.Automaton()
    for text, credential, kind in needles:
        # Two credentials with one value: the first listed names it.
        if automaton.get(text, None) is None:
            automaton.add_word(text, (credential, kind, len(text)))
    automaton.make_automaton()
    return automaton


class ExactNeedles:
    """The automata over every held value and placeholder of one snapshot of the store."""

    __slots__ = ("_dns", "_main", "max_length")

    def __init__(self, values: list[tuple[str, bytes]], placeholders: list[tuple[str, str]]) -> None:
        needles: list[tuple[str, str, NeedleKind]] = [
            (value.decode("latin-1"), name, "value") for name, value in values if len(value) >= MIN_VALUE_CHARS
        ]
        needles += [(placeholder, name, "placeholder") for name, placeholder in placeholders]
        self._main = _automaton(needles)
        self._dns = _automaton([(p.lower(), name, "placeholder") for name, p in placeholders])
        self.max_length = max((len(text) for text, _, _ in needles), default=0)

    @property
    def empty(self) -> bool:
        return self._main is None

    def find(self, data: bytes | str, start: int = 0) -> list[ExactHit]:
        """Every hit ending at or after `start` (earlier ones were reported by the previous call
        of a streaming scan)."""
        if self._main is None:
            return []
        text = data.decode("latin-1") if isinstance(data, bytes) else data
        out: list[ExactHit] = []
        for end_index, (credential, kind, length) in self._main.iter(text):
            end = end_index + 1
            if end > start:
                out.append(ExactHit(credential, kind, end - length, end))
        return out

    def find_in_dns_name(self, name: str) -> list[str]:
        """Credentials whose placeholder a DNS name carries, in any case and across labels (an
        agent can split a placeholder with dots: `egph_abc.def.attacker.example`)."""
        if self._dns is None:
            return []
        joined = name.lower().replace(".", "")
        return sorted({credential for _, (credential, _, _) in self._dns.iter(joined)})
