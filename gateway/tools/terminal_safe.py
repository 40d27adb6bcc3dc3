"""What a tool may hand an agent: text without terminal control sequences or hidden characters.

CLI agents print tool output to a terminal, and a web page can carry `ESC ] 52 ; ... BEL` (a
clipboard write), `ESC [ 8 m` (hidden text) or a bare BEL, spelled as entities that decoding
turns into the raw bytes; and instructions meant for the model can be hidden from the human who
reviews the transcript with Unicode tag characters (U+E0000-E007F, invisible ASCII) or bidi
overrides and isolates (text displayed in another order than it is read). Every string a tool
returns goes through `Stripper` after entity decoding, which removes them and counts them, so a
result can say how many were removed. Tab and newline stay: they are the text's own layout.
Pure: no I/O; never rewrites anything but the characters named here.
"""

from __future__ import annotations

import re

# C0 controls but tab (09) and newline (0a); DEL and the C1 controls (CSI 9b, OSC 9d, ...);
# bidi embeddings and overrides (202a-202e) and isolates (2066-2069); the tag block.
UNSAFE_CHARS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\U000e0000-\U000e007f]")


def strip_unsafe(text: str) -> tuple[str, int]:
    """`text` without the unsafe characters, and how many there were."""
    return UNSAFE_CHARS.subn("", text)


class Stripper:
    """Strips the strings of one result and keeps the total for its `controlCharsRemoved`."""

    __slots__ = ("removed",)

    def __init__(self) -> None:
        self.removed = 0

    def __call__(self, text: str) -> str:
        cleaned, removed = UNSAFE_CHARS.subn("", text)
        self.removed += removed
        return cleaned
