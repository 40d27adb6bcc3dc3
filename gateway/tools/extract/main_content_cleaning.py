"""Cleaning of the chosen main content: share bars, link lists and media boxes left inside it.

Owns Readability's conditional cleaning, done in one bottom-up pass: every element's text
length, commas, link text and counts of paragraphs, images and list items are summed from its
children once, and an element that is removed simply does not pass its sums up. Judging each
candidate with its own selector and text walks instead cost depth times size (about a second on
a page nested 10,000 deep). It only prunes the subtrees it is given; it never scores or parses.
"""

from __future__ import annotations

from operator import add

from selectolax.lexbor import LexborNode

from gateway.tools.extract.main_content_boilerplate import remove_boilerplate_blocks
from gateway.tools.extract.main_content_words import (
    NAMED_CHROME,
    NAMED_CHROME_SELECTOR,
    SHARE_BAR,
    SHARE_BAR_CANDIDATES,
    ClassWeights,
    Strictness,
    class_and_id,
    comma_count,
    mentions,
    reading_length,
)

# Elements that conditional cleaning judges: containers that may hold chrome, never a paragraph.
JUDGED_TAGS = frozenset({"table", "ul", "ol", "div", "section", "header", "form"})
# Elements whose presence keeps a short box: it holds code or a heading, not chrome.
KEEPER_TAGS = frozenset({"pre", "code", "h1", "h2", "h3", "h4", "h5", "h6"})
SHARE_BAR_MAX_CHARS = 500
# What named-chrome pruning may drop: boxes and text blocks, never a link or the article itself.
NAMED_CHROME_TAGS = frozenset(
    {"div", "section", "p", "span", "ul", "ol", "li", "figure", "figcaption", "aside", "header", "small", "table"}
)
MIN_BOX_CHARS = 25
# A box with this many commas is prose, whatever its links.
PROSE_COMMAS = 10
NEGATIVE_PROSE_CHARS = 200

# Slots of a tally (a plain list: this pass runs once per element, so attribute access counts).
# RUNS counts text runs: the page's text puts a space between runs, link text (measured as
# Readability does) does not.
# BACKLINKS counts in-page links of one or two characters (^, ↑, a, b): a footnote's way back
# to where it is cited, so a list whose items carry them is the page's notes, not chrome.
CHARS, RUNS, COMMAS, LINK_CHARS, PARAGRAPHS, IMAGES, ITEMS, FIGURES, KEEPERS, BACKLINKS = range(10)
TALLY_SIZE = 10
BACKLINK_MAX_CHARS = 2


def clean_article(nodes: list[LexborNode], strictness: Strictness) -> None:
    """Drop share bars, link lists and other chrome left inside the chosen content."""
    weights = ClassWeights()
    for root in nodes:
        remove_named_chrome(root)
        _clean_subtree(root, strictness, weights)
        remove_boilerplate_blocks(root)


def remove_named_chrome(root: LexborNode) -> None:
    """Drop boxes inside the chosen content whose class or id names chrome (teaser, caption, ...).

    Scoring judged the page before the content was known, and spared such boxes while they were
    big; inside the article such a box is furniture whatever its size. At most half of the
    article's text goes, so an article whose own wrappers carry one of the words (a page that
    is one list of teasers) is not emptied. Innermost first, so the text of a box counts once:
    when its outer box goes, the inner one is already gone from it.
    """
    # Measured when the first box is met, before anything goes: most articles hold none, and
    # reading the whole article's text was a quarter of this step.
    budget = -1
    root_id = root.mem_id
    for node in reversed(root.css(NAMED_CHROME_SELECTOR)):
        if node.mem_id == root_id or node.tag not in NAMED_CHROME_TAGS:
            continue
        if not mentions(class_and_id(node), NAMED_CHROME):
            continue
        if budget < 0:
            budget = len(root.text(deep=True)) // 2
        chars = len(node.text(deep=True))
        if chars > budget:
            continue
        budget -= chars
        node.decompose()


def _clean_subtree(root: LexborNode, strictness: Strictness, weights: ClassWeights) -> None:
    # One C selector finds the few share-bar suspects; the walk below only looks them up.
    share_suspects = {node.mem_id for node in root.css(SHARE_BAR_CANDIDATES)}
    root_id = root.mem_id
    conditional = strictness.clean_conditionally
    counted_tags = COUNTED_TAGS
    judged_tags = JUDGED_TAGS
    pending: dict[int, list[int]] = {}
    # Reversed document order visits every element after all of its descendants, so a removal
    # never touches a node that is still to be judged, and a parent's sums are complete.
    for node in reversed(root.css("*")):
        key = node.mem_id
        tally = pending.pop(key, None)
        own = node.text(deep=False)
        chars = commas = -1
        if own and not own.isspace():
            if own.isascii():
                # The common case, measured inline: commas are not whitespace, so the raw text
                # has as many as the collapsed one.
                chars = len(" ".join(own.split()))
                commas = own.count(",")
            else:
                text = " ".join(own.split())
                chars = reading_length(text)
                commas = comma_count(text)
        tag = node.tag or ""
        if key == root_id:
            continue
        if tally is None and tag not in judged_tags and key not in share_suspects:
            # A leaf that is never judged (most elements: links, spans, citations): its own
            # measures go straight into its parent's sums, without a tally of its own.
            counted_slot = counted_tags.get(tag)
            if chars < 0 and counted_slot is None:
                continue
            parent = node.parent
            if parent is None:
                continue
            parent_key = parent.mem_id
            into = pending.get(parent_key)
            if into is None:
                into = pending[parent_key] = [0] * TALLY_SIZE
            if chars >= 0:
                into[CHARS] += chars
                into[RUNS] += 1
                into[COMMAS] += commas
                if tag == "a":
                    into[LINK_CHARS] += chars
                    if chars <= BACKLINK_MAX_CHARS and _links_in_page(node):
                        into[BACKLINKS] += 1
            if counted_slot is not None:
                into[counted_slot] += 1
            continue
        if chars >= 0:
            if tally is None:
                tally = [0] * TALLY_SIZE
            tally[CHARS] += chars
            tally[RUNS] += 1
            tally[COMMAS] += commas
        if (
            key in share_suspects
            and (tally is None or tally[CHARS] + tally[RUNS] < SHARE_BAR_MAX_CHARS)
            and SHARE_BAR.search(class_and_id(node))
        ):
            node.decompose()
            continue
        if conditional and tag in judged_tags and _is_fishy(node, tag, tally, strictness, weights):
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
        if tally is not None:
            if tag == "a":
                # Everything inside a link is link text, whatever it is wrapped in.
                tally[LINK_CHARS] = tally[CHARS]
            into = pending[parent_key] = tally if into is None else list(map(add, into, tally))
        elif into is None:
            into = pending[parent_key] = [0] * TALLY_SIZE
        if counted_slot is not None:
            into[counted_slot] += 1


COUNTED_TAGS: dict[str, int] = {"p": PARAGRAPHS, "img": IMAGES, "li": ITEMS, "figure": FIGURES} | dict.fromkeys(
    KEEPER_TAGS, KEEPERS
)
_EMPTY = (0,) * TALLY_SIZE


def _links_in_page(anchor: LexborNode) -> bool:
    return (anchor.attributes.get("href") or "").lstrip()[:1] == "#"


def _is_fishy(
    node: LexborNode, tag: str, tally: list[int] | None, strictness: Strictness, weights: ClassWeights
) -> bool:
    """Readability's conditional cleaning: lists and boxes that are mostly links or media."""
    weight = weights.of(node) if strictness.weigh_classes else 0
    sums = tally if tally is not None else _EMPTY
    if weight < 0:
        # A chrome-sounding class (`scrollblock`) on a box of several prose paragraphs names
        # its behaviour, not its content.
        prose = sums[PARAGRAPHS] >= 2 and sums[CHARS] >= NEGATIVE_PROSE_CHARS
        return not (prose and sums[LINK_CHARS] * 10 < sums[CHARS])
    if sums[COMMAS] >= PROSE_COMMAS:
        return False
    if sums[BACKLINKS] and sums[BACKLINKS] * 2 >= sums[ITEMS] > 0:
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
