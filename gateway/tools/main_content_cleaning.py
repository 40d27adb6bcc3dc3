"""Cleaning of the chosen main content: share bars, link lists and media boxes left inside it.

Owns Readability's conditional cleaning, done in one bottom-up pass: every element's text
length, commas, link text and counts of paragraphs, images and list items are summed from its
children once, and an element that is removed simply does not pass its sums up. Judging each
candidate with its own selector and text walks instead cost depth times size (about a second on
a page nested 10,000 deep). It only prunes the subtrees it is given; it never scores or parses.
"""

from __future__ import annotations

from selectolax.lexbor import LexborNode

from gateway.tools.main_content_words import (
    SHARE_BAR,
    SHARE_BAR_CANDIDATES,
    Strictness,
    class_and_id,
    class_weight,
    comma_count,
    reading_length,
)

# Elements that conditional cleaning judges: containers that may hold chrome, never a paragraph.
JUDGED_TAGS = frozenset({"table", "ul", "ol", "div", "section", "header", "form"})
# Elements whose presence keeps a short box: it holds code or a heading, not chrome.
KEEPER_TAGS = frozenset({"pre", "code", "h1", "h2", "h3", "h4", "h5", "h6"})
SHARE_BAR_MAX_CHARS = 500
MIN_BOX_CHARS = 25
# A box with this many commas is prose, whatever its links.
PROSE_COMMAS = 10

# Slots of a tally (a plain list: this pass runs once per element, so attribute access counts).
# RUNS counts text runs: the page's text puts a space between runs, link text (measured as
# Readability does) does not.
CHARS, RUNS, COMMAS, LINK_CHARS, PARAGRAPHS, IMAGES, ITEMS, FIGURES, KEEPERS = range(9)
TALLY_SIZE = 9


def clean_article(nodes: list[LexborNode], strictness: Strictness) -> None:
    """Drop share bars, link lists and other chrome left inside the chosen content."""
    for root in nodes:
        _clean_subtree(root, strictness)


def _clean_subtree(root: LexborNode, strictness: Strictness) -> None:
    # One C selector finds the few share-bar suspects; the walk below only looks them up.
    share_suspects = {node.mem_id for node in root.css(SHARE_BAR_CANDIDATES)}
    root_id = root.mem_id
    conditional = strictness.clean_conditionally
    counted_tags = COUNTED_TAGS
    pending: dict[int, list[int]] = {}
    # Reversed document order visits every element after all of its descendants, so a removal
    # never touches a node that is still to be judged, and a parent's sums are complete.
    for node in reversed(root.css("*")):
        key = node.mem_id
        tally = pending.pop(key, None)
        own = node.text(deep=False)
        if own and not own.isspace():
            text = " ".join(own.split())
            if tally is None:
                tally = [0] * TALLY_SIZE
            tally[CHARS] += reading_length(text)
            tally[RUNS] += 1
            tally[COMMAS] += comma_count(text)
        tag = node.tag or ""
        if key == root_id:
            continue
        small = tally is None or tally[CHARS] + tally[RUNS] < SHARE_BAR_MAX_CHARS
        if small and key in share_suspects and SHARE_BAR.search(class_and_id(node)):
            node.decompose()
            continue
        if conditional and tag in JUDGED_TAGS and _is_fishy(node, tag, tally, strictness):
            node.decompose()
            continue
        counted_slot = counted_tags.get(tag)
        if tally is None and counted_slot is None:
            continue
        parent = node.parent
        if parent is None:
            continue
        # Pass the element's sums, and the element itself, up to its parent.
        parent_key = parent.mem_id
        into = pending.get(parent_key)
        if into is None:
            if tally is not None and tag != "a":
                into = pending[parent_key] = tally
                tally = None
            else:
                into = pending[parent_key] = [0] * TALLY_SIZE
        if tally is not None:
            for slot in range(TALLY_SIZE):
                into[slot] += tally[slot]
            if tag == "a":
                # Everything inside a link is link text, whatever it is wrapped in.
                into[LINK_CHARS] += tally[CHARS] - tally[LINK_CHARS]
        if counted_slot is not None:
            into[counted_slot] += 1


COUNTED_TAGS: dict[str, int] = {"p": PARAGRAPHS, "img": IMAGES, "li": ITEMS, "figure": FIGURES} | dict.fromkeys(
    KEEPER_TAGS, KEEPERS
)
_EMPTY = (0,) * TALLY_SIZE


def _is_fishy(node: LexborNode, tag: str, tally: list[int] | None, strictness: Strictness) -> bool:
    """Readability's conditional cleaning: lists and boxes that are mostly links or media."""
    weight = class_weight(node) if strictness.weigh_classes else 0
    if weight < 0:
        return True
    sums = tally if tally is not None else _EMPTY
    if sums[COMMAS] >= PROSE_COMMAS:
        return False
    chars = sums[CHARS] + sums[RUNS]
    density = min(1.0, sums[LINK_CHARS] / chars) if chars else 0.0
    if tag == "header":
        return density > 0.5
    if tag in ("ul", "ol"):
        return density > 0.5 and weight < 25
    paragraphs, images = sums[PARAGRAPHS], sums[IMAGES]
    if images > 1 and paragraphs / images < 0.5 and not sums[FIGURES]:
        return True
    if sums[ITEMS] - 100 > paragraphs:
        return True
    if chars < MIN_BOX_CHARS and images == 0 and tag != "table":
        return not sums[KEEPERS]
    if weight < 25 and density > 0.2:
        return True
    return weight >= 25 and density > 0.5
