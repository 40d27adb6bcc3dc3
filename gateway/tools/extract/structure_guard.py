"""Refuses, before any HTML parser sees it, a page whose shape makes parsing quadratic.

Lexbor (selectolax's parser) does work per element proportional to the depth of the stack of open
elements, and per attribute proportional to the attributes its element already has (the duplicate
check): a 1 MB page of nested `<div>`s or one element with 200,000 attributes holds a converter
for minutes, and the cleaning passes after it walk every subtree again. Browsers bound the same
thing (Blink nests at most 512 elements deep). This module scans the markup once, in time linear
in its length, estimating the nesting depth (elements that close themselves or are closed
implicitly are not counted; raw text of scripts, styles and comments is skipped) and counting
each tag's attributes, and refuses with `too_large` past the caps. Pure: never builds a tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType

from gateway.errors import ErrorCode, GatewayError

# Far above real pages (tens of levels, a few dozen attributes: 309 and 70 at most in the fixture
# pages) and above the suite's pathological page (3,000 divs, 1,000 unclosed <b><i>); far below
# the bombs (45,000-145,000 levels in 0.5-1.6 MB), where parsing takes minutes.
MAX_NESTING_DEPTH = 6_000
MAX_ATTRIBUTES_PER_ELEMENT = 1_000

_TAG_START = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9:-]*)|<!--")
# An attribute's name, and the `=` of its value if it has one; a quoted value is skipped with
# str.find (remembering a quote that never closes), so the scan of a tag stays linear.
_ATTRIBUTE_NAME = re.compile(r"""[\s/]*[^\s"'>/=][^\s"'>/=]*(\s*=\s*)?""")
_UNQUOTED_VALUE = re.compile(r"""[^\s"'>]*""")
_TAG_END = re.compile(r"\s*(/?)>")
VOID = frozenset(
    [
        "area",
        "base",
        "br",
        "col",
        "embed",
        "hr",
        "img",
        "input",
        "link",
        "meta",
        "source",
        "track",
        "wbr",
        "param",
        "keygen",
        "frame",
        "basefont",
        "bgsound",
    ]
)
# Closed implicitly by a sibling or their parent's end: never deeper than their container.
IMPLICITLY_CLOSED = frozenset(
    [
        "p",
        "li",
        "dt",
        "dd",
        "option",
        "optgroup",
        "tr",
        "td",
        "th",
        "thead",
        "tbody",
        "tfoot",
        "colgroup",
        "caption",
        "rb",
        "rt",
        "rtc",
        "rp",
        "html",
        "head",
        "body",
    ]
)
RAW_TEXT = frozenset({"script", "style", "textarea", "title", "xmp", "iframe", "noembed", "noframes", "plaintext"})
FOREIGN = frozenset({"svg", "math"})
_RAW_TEXT_END = MappingProxyType({name: re.compile(rf"</{name}", re.IGNORECASE) for name in RAW_TEXT})


@dataclass(frozen=True, slots=True)
class Shape:
    """What the scan saw: tags read, the deepest estimated nesting, the most attributes on one."""

    tags_scanned: int
    max_depth: int
    max_attributes: int


def measure(html: str) -> Shape:
    """One linear pass over the markup (see the module docstring); stops early past a cap."""
    depth = max_depth = max_attributes = tags = foreign = 0
    position = 0
    length = len(html)
    while position < length and max_depth <= MAX_NESTING_DEPTH and max_attributes <= MAX_ATTRIBUTES_PER_ELEMENT:
        match = _TAG_START.search(html, position)
        if match is None:
            break
        tags += 1
        if match.group(0) == "<!--":
            comment_end = html.find("-->", match.end())
            position = length if comment_end < 0 else comment_end + 3
            continue
        closing, name = match.group(1), match.group(2).lower()
        position, attributes, self_closed = _read_tag(html, match.end())
        if closing:
            if name in FOREIGN:
                foreign = max(0, foreign - 1)
            if name not in VOID and name not in IMPLICITLY_CLOSED:
                depth = max(0, depth - 1)
            continue
        max_attributes = max(max_attributes, attributes)
        if name in RAW_TEXT:
            raw_end = _RAW_TEXT_END[name].search(html, position)
            position = length if raw_end is None else raw_end.start()
            continue
        if name in FOREIGN:
            foreign += 1
        # `<x/>` closes itself only in SVG and MathML; in HTML a `<div/>` is an open div.
        if name in VOID or name in IMPLICITLY_CLOSED or (self_closed and foreign):
            continue
        depth += 1
        max_depth = max(max_depth, depth)
    return Shape(tags, max_depth, max_attributes)


def _read_tag(html: str, position: int) -> tuple[int, int, bool]:
    """From after a tag's name: where the tag ends, its attribute count, whether it ends in `/>`."""
    attributes = 0
    length = len(html)
    while position < length:
        end = _TAG_END.match(html, position)
        if end is not None:
            return end.end(), attributes, bool(end.group(1))
        name = _ATTRIBUTE_NAME.match(html, position)
        if name is None:
            # A stray quote or `=`: skip the byte, as a tokenizer would treat it as part of a name.
            position += 1
            continue
        attributes += 1
        if attributes > MAX_ATTRIBUTES_PER_ELEMENT:
            return name.end(), attributes, False
        position = name.end()
        if name.group(1) is None or position >= length:
            continue
        quote = html[position]
        if quote in "\"'":
            closing = html.find(quote, position + 1)
            if closing < 0:
                # Never closed: the rest of the input is this value (as the HTML tokenizer reads it).
                return length, attributes, False
            position = closing + 1
        else:
            value = _UNQUOTED_VALUE.match(html, position)
            position = value.end() if value is not None else position + 1
    return length, attributes, False


def check_structure(html: str) -> Shape:
    """The page's shape, or `too_large` when its nesting or one element's attributes pass a cap."""
    shape = measure(html)
    if shape.max_depth > MAX_NESTING_DEPTH:
        raise GatewayError(
            ErrorCode.TOO_LARGE, f"the page nests elements over {MAX_NESTING_DEPTH} deep (a parser bomb)"
        )
    if shape.max_attributes > MAX_ATTRIBUTES_PER_ELEMENT:
        raise GatewayError(
            ErrorCode.TOO_LARGE,
            f"an element of the page has over {MAX_ATTRIBUTES_PER_ELEMENT} attributes (a parser bomb)",
        )
    return shape
