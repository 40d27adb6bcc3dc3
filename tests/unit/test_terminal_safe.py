"""The characters a tool never hands a terminal, and the ones it keeps."""

from __future__ import annotations

import pytest

from gateway.tools.terminal_safe import Stripper, strip_unsafe


@pytest.mark.parametrize(
    ("raw", "kept", "removed"),
    [
        pytest.param("a\tb\nc", "a\tb\nc", 0, id="tab-and-newline-stay"),
        pytest.param("\x1b]52;c;ZXZpbA==\x07", "]52;c;ZXZpbA==", 2, id="osc52-clipboard-write"),
        pytest.param("\x1b[8mhidden", "[8mhidden", 1, id="sgr-hidden-text"),
        pytest.param("line\rover", "lineover", 1, id="carriage-return"),
        pytest.param("\x00\x08\x0b\x0c\x1f\x7f", "", 6, id="c0-and-del"),
        pytest.param("\x9b31m\x9d0;t\x9c", "31m0;t", 3, id="c1-csi-osc-st"),
        pytest.param("\u202eexe.txt\u202c", "exe.txt", 2, id="bidi-override"),
        pytest.param("\u2066a\u2067b\u2068c\u2069", "abc", 4, id="bidi-isolates"),
        pytest.param("ok\U000e0001\U000e0069\U000e007f", "ok", 3, id="tag-characters"),
        pytest.param("\u200f\u05d0\u200e", "\u200f\u05d0\u200e", 0, id="rtl-marks-stay"),
        pytest.param("caf\u00e9 \u00a0 \u2028", "caf\u00e9 \u00a0 \u2028", 0, id="latin1-and-separators-stay"),
    ],
)
def test_strip_unsafe_removes_controls_and_hidden_characters(raw: str, kept: str, removed: int) -> None:
    assert strip_unsafe(raw) == (kept, removed)


def test_a_stripper_counts_over_every_string_of_a_result() -> None:
    strip = Stripper()
    assert [strip("a\x1b"), strip("b"), strip("\u202ec\x07")] == ["a", "b", "c"]
    assert strip.removed == 3
