"""Text measures of main-content scoring: one pass gives what the two separate measures give."""

from __future__ import annotations

import pytest

from gateway.tools.extract.main_content_words import comma_count, measure_text, reading_length


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
