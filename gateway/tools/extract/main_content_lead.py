"""The lead of an article: the standfirst, intro or deck that sits before the body's container.

Owns the search for the nearest prose blocks before the chosen content (a `p.lead`, an intro
`div`, a deck under the headline), which sites put in the article's header, a sibling of the
container that holds the paragraphs, so they get few votes. It only reads the tree and returns
nodes to prepend; it never prunes, scores or renders.
"""

from __future__ import annotations

from selectolax.lexbor import LexborNode

from gateway.tools.extract.main_content_boilerplate import CAPTION_CREDIT
from gateway.tools.extract.main_content_measure import TextStats
from gateway.tools.extract.main_content_words import SENTENCE_END, class_and_id, mentions, reading_length

# Where an article's lead is looked for: levels above the chosen content, siblings before it.
LEAD_LEVELS = 5
# Up to this many levels the search always climbs; above, only while the enclosing element holds
# little besides the content (a headline, byline, caption and lead, not the page's other boxes).
LEAD_NEAR_LEVELS = 3
LEAD_CLIMB_CHARS = 2_000
LEAD_SIBLINGS = 3
LEAD_MAX_BLOCKS = 2
LEAD_TAGS = frozenset({"p", "h2"})
LEAD_SELECTOR = "p, h2, div"
PICTURE_SELECTOR = "img, picture, figure"
# Class words of the blocks that sit beside a lead: the author's bio, a caption, a credit.
NOT_LEAD = ("author", "byline", "media", "affiliate", "disclaimer", "disclosure", "credit")
LEAD_MIN_CHARS = 60
LEAD_MAX_CHARS = 1_000
LEAD_MAX_LINK_DENSITY = 0.2
# A div with none of these among its children holds only inline text.
BLOCKS_UNDER_DIV = frozenset({"blockquote", "dl", "div", "img", "ol", "p", "pre", "table", "ul"})


def lead_blocks(top: LexborNode, article: list[LexborNode], stats: TextStats) -> list[LexborNode]:
    """The lead of the article when it sits before the body's container, in document order.

    Sites put the standfirst (a `p.lead`, an intro `div`, a deck under the headline) in the
    article's header, a sibling of the container that holds the paragraphs, so it gets few
    votes and was left out. The nearest prose blocks before the chosen content are taken:
    prose-long, few links, a sentence. The search climbs while the enclosing element holds
    little besides the content (the article's own header, not the page's), and skips blocks
    whose class says they are an author box or metadata.
    """
    taken = {node.mem_id for node in article}
    content_chars = sum(stats.text_length(node) for node in article)
    node = top
    for level in range(LEAD_LEVELS):
        parent = node.parent
        if parent is None or parent.tag in ("body", "html"):
            return []
        if level >= LEAD_NEAR_LEVELS and stats.text_length(parent) > content_chars + LEAD_CLIMB_CHARS:
            return []
        leads: list[LexborNode] = []
        sibling = node.prev
        looked = 0
        while sibling is not None and looked < LEAD_SIBLINGS:
            if sibling.is_element_node and sibling.mem_id not in taken:
                looked += 1
                leads.extend(block for block in reversed(_lead_candidates(sibling)) if _reads_like_lead(block, stats))
            sibling = sibling.prev
        if leads:
            return list(reversed(leads))[-LEAD_MAX_BLOCKS:]
        node = parent
    return []


def _lead_candidates(sibling: LexborNode) -> list[LexborNode]:
    """The blocks of a sibling that may be a lead: paragraphs, and divs holding only inline text."""
    if _negative_class(sibling):
        return []
    if sibling.tag in LEAD_TAGS or (sibling.tag == "div" and _inline_only(sibling)):
        return [sibling]
    # The first few paragraphs and the first few text-only divs, in document order.
    found = []
    counts = {"p": 0, "div": 0}
    for block in sibling.css(LEAD_SELECTOR):
        kind = "div" if block.tag == "div" else "p"
        if counts[kind] == LEAD_SIBLINGS or (kind == "div" and not _inline_only(block)):
            continue
        counts[kind] += 1
        if not _negative_class_between(block, sibling):
            found.append(block)
    return found


def _inline_only(div: LexborNode) -> bool:
    child = div.child
    while child is not None:
        if child.tag in BLOCKS_UNDER_DIV:
            return False
        child = child.next
    return True


def _negative_class(node: LexborNode) -> bool:
    """Whether the class or id names what sits beside a lead but is not one (a bio, a caption)."""
    return mentions(class_and_id(node), NOT_LEAD)


def _negative_class_between(block: LexborNode, sibling: LexborNode) -> bool:
    node: LexborNode | None = block
    while node is not None and node.mem_id != sibling.mem_id:
        if _negative_class(node):
            return True
        node = node.parent
    return False


def _reads_like_lead(node: LexborNode, stats: TextStats) -> bool:
    text = " ".join(node.text(deep=True).split())
    length = reading_length(text)
    if not LEAD_MIN_CHARS <= length <= LEAD_MAX_CHARS:
        return False
    # A caption names who took the picture; a lead never does.
    if CAPTION_CREDIT.search(text.lower()) or node.css_first(PICTURE_SELECTOR) is not None:
        return False
    return stats.link_density(node) < LEAD_MAX_LINK_DENSITY and bool(SENTENCE_END.search(text))
