"""Text measures of main-content scoring: one pass gives what the two separate measures give."""

from __future__ import annotations

import re

import pytest

from gateway.tools.extract.main_content_words import any_of, comma_count, measure_text, reading_length


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("Plain words, two clauses.", id="ascii"),
        pytest.param("Prüfung für Übungen, Schwerpunkt \u2013 Nutzfahrzeuge", id="accented-latin"),
        pytest.param("中文\uff0c字\u3001符。", id="chinese-with-ideographic-commas"),
        pytest.param("مرحبا، بك", id="arabic-comma"),
        pytest.param("한국어 문장, 그리고", id="hangul"),
        pytest.param("\uff46\uff55\uff4c\uff4c\uff0ctext", id="fullwidth-forms"),
        pytest.param("a\u2e41b\ufe50c\ufe10d", id="rare-commas"),
    ],
)
def test_measure_text_matches_reading_length_and_comma_count(text: str) -> None:
    assert measure_text(text) == (reading_length(text), comma_count(text))


def test_the_trie_regex_finds_exactly_what_a_flat_alternation_finds() -> None:
    words = ("art", "article", "and", "-ad-", "ad-break", "banner", "body", "co", "comment", "column")
    flat = re.compile("|".join(re.escape(word) for word in words))
    trie = any_of(words)
    letters = "abcdeilmnortuy-"
    samples = [*words, *(a + b for a in words for b in words)]
    samples += ["".join(letters[(seed * 7 + n * 3) % len(letters)] for n in range(seed % 17)) for seed in range(3_000)]
    for sample in samples:
        assert bool(trie.search(sample)) == bool(flat.search(sample)), sample
