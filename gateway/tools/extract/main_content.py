"""Main-content detection for web_fetch: which part of a parsed page is the article.

Owns the page-chrome rules (what is hidden, what is boilerplate) and the scoring that picks the
element holding the body text: paragraphs vote for their ancestors, votes are discounted by link
density and by class/id words, and the best candidate is taken with the siblings that belong to
it (the approach of Mozilla's Readability, reimplemented over selectolax). The word lists live
in `main_content_words`, the cleaning of the chosen content in `main_content_cleaning`, text
and link lengths in `main_content_measure`. It only prunes parsed trees (parsing the page once
per pass): it never renders markdown or touches the network.
Every loop is iterative or bounded, so a 10,000-deep page cannot exhaust the Python stack.
"""

from __future__ import annotations

import enum
import re
from types import MappingProxyType

from selectolax.lexbor import LexborHTMLParser, LexborNode

from gateway.tools.extract.main_content_cleaning import clean_article
from gateway.tools.extract.main_content_lead import lead_blocks
from gateway.tools.extract.main_content_measure import TextStats, surely_holds, text_length
from gateway.tools.extract.main_content_words import (
    ANY_VERDICT_WORD,
    CHROME_ROLES,
    CHROME_TAGS,
    HIDDEN_STYLE,
    JUNK_TAGS,
    MAYBE_CONTENT,
    PASSES,
    SENTENCE_END,
    SMALL_WIDGET,
    SMALL_WIDGET_CHARS,
    UNLIKELY,
    WIDE_CHAR_EXTRA,
    WIDE_SCRIPT,
    ClassWeights,
    Strictness,
    comma_count,
    measure_text,
    mentions,
    reading_length,
)

SCORED_SELECTOR = "p, pre, td, section, h2, h3, h4, h5, h6"
JUNK_AND_CHROME_SELECTOR = ", ".join([*JUNK_TAGS, *CHROME_TAGS])
HIDDEN_OR_ROLE_SELECTOR = '[hidden], [aria-hidden="true" i], [style*="none" i], [style*="hidden" i], [role]'
# Divs with none of these below them hold only inline content and read as paragraphs.
BLOCK_TAGS_UNDER_DIV = ("blockquote", "dl", "div", "img", "ol", "p", "pre", "table", "ul")
BLOCK_SELECTOR_UNDER_DIV = ", ".join(BLOCK_TAGS_UNDER_DIV)
TAG_BASE_SCORE = MappingProxyType({
    "div": 5, "pre": 3, "td": 3, "blockquote": 3,
    "address": -3, "ol": -3, "ul": -3, "dl": -3, "dd": -3, "dt": -3, "li": -3, "form": -3,
    "h1": -5, "h2": -5, "h3": -5, "h4": -5, "h5": -5, "h6": -5, "th": -5,
})  # fmt: skip
MIN_PARAGRAPH_CHARS = 25
# A block with more commas than this is a list of names or tags, not more of an article.
MAX_VOTED_COMMAS = 20
MAX_VOTE_LEVELS = 5
# A block's length vote grows by one per 100 characters up to this length.
LONGEST_VOTED_CHARS = 300
# Raw text longer than this is judged long from its first this-many characters.
LONG_RAW_CHARS = 2_000
# A paragraph's vote is divided by these at its parent, grandparent, ... (Readability's 1, 2, 3 x level).
VOTE_DIVIDERS = (1, 2, 6, 9, 12)
TOP_CANDIDATES = 5
# A small form is a search box or a comment form; a big one is an ASP.NET page wrapper.
SMALL_FORM_CHARS = 250
EDIT_LINK_SELECTOR = 'a[href*="action=edit" i], a[href*="action=submit" i]'
EDIT_LINK = re.compile(r"[?&](?:ve)?action=(?:edit|submit)\b", re.I)
EDIT_LINK_MAX_CHARS = 30
EDIT_LINK_REMNANTS = " []|\n\t"
MOST_OF_PAGE = 0.6
NOSCRIPT_PAGE_CHARS = 2_000
# Below this much text the strict pass probably threw the article away: retry looser.
MIN_ARTICLE_CHARS = 500


def remove_hidden_and_junk(tree: LexborHTMLParser) -> None:
    """Drop what a reader never sees: junk tags, hidden elements, chrome landmarks.

    Every removal loop runs innermost first: `decompose` frees the subtree, so a nested match
    must go before its ancestor does.
    """
    # Junk and chrome tags go whatever their contents, so one selector walk finds both. A page
    # written for browsers without scripts puts its whole text in one <noscript>: that one is
    # the page, not a fallback notice ("please enable JavaScript"), and is unwrapped instead
    # (measured after the scripts inside it went, being innermost first).
    for node in reversed(tree.css(JUNK_AND_CHROME_SELECTOR)):
        if node.tag == "noscript" and text_length(node) >= NOSCRIPT_PAGE_CHARS:
            node.unwrap()
        else:
            node.decompose()
    # Hidden elements and chrome roles in one selector walk; the role test is done in Python
    # (an 11-way attribute selector is slower).
    for node in reversed(tree.css(HIDDEN_OR_ROLE_SELECTOR)):
        attrs = node.attributes
        style = attrs.get("style") or ""
        aria_hidden = (attrs.get("aria-hidden") or "").strip().lower() == "true"
        chrome_role = (attrs.get("role") or "").strip().lower() in CHROME_ROLES
        if "hidden" in attrs or aria_hidden or chrome_role or HIDDEN_STYLE.search(style):
            node.decompose()
    for form in reversed(tree.css("form")):
        # ASP.NET pages wrap the whole body in one <form>: only small forms are chrome.
        if text_length(form) < SMALL_FORM_CHARS:
            form.decompose()
    remove_edit_links(tree)


def remove_edit_links(tree: LexborHTMLParser) -> None:
    """Drop wiki and CMS edit links ("[edit]", "[edit | edit source]") with their brackets.

    Found by what they do (`action=edit` in the URL, a few words of text), not by a class: left
    in, they made a section heading's wrapper read as a link box and took the heading with it.
    """
    for anchor in reversed(tree.css(EDIT_LINK_SELECTOR)):
        text = anchor.text(deep=True)
        if len(text) > EDIT_LINK_MAX_CHARS or not EDIT_LINK.search(anchor.attributes.get("href") or ""):
            continue
        parent = anchor.parent
        anchor.decompose()
        if parent is not None and parent.tag == "span" and not parent.text(deep=True).strip(EDIT_LINK_REMNANTS):
            parent.decompose()


def remove_unlikely_candidates(body: LexborNode) -> None:
    """Drop elements whose class/id says menu, comments, share bar... unless it also says content."""
    # Sites repeat the same few class lists thousands of times: judge each list once.
    verdicts: dict[tuple[str | None, str | None], Verdict] = {}
    # Elements known to hold a lot of text, and so all of their ancestors: a widget word on a
    # big wrapper is kept without measuring it, which keeps nested wrappers linear.
    known_big: set[int] = set()
    keep = Verdict.KEEP  # looked up once: this loop runs for every element with a class or id
    # A chrome word on an element holding most of the page (`above-footer` around a whole
    # article) names where it sits, not what it is. Measured once, when first needed.
    most_of_page = -1.0
    for node in reversed(body.css("[class], [id]")):
        attributes = node.attributes
        key = (attributes.get("class"), attributes.get("id"))
        verdict = verdicts.get(key)
        if verdict is None:
            verdict = verdicts[key] = _class_verdict(f"{key[0] or ''} {key[1] or ''}".lower())
        if verdict is keep or node.tag in ("body", "html", "a", "article", "main"):
            continue
        if _inside_table(node):
            continue
        if verdict is Verdict.DROP_IF_SMALL and _holds_much_text(node, known_big):
            continue
        if verdict is Verdict.DROP and node.tag == "div":
            if most_of_page < 0:
                most_of_page = len(body.text(deep=True)) * MOST_OF_PAGE
            if len(node.text(deep=True)) > most_of_page:
                continue
        node.decompose()


class Verdict(enum.Enum):
    """What an element's class and id say about it, before its contents are looked at."""

    KEEP = enum.auto()
    DROP = enum.auto()
    DROP_IF_SMALL = enum.auto()


def _class_verdict(words: str) -> Verdict:
    if ANY_VERDICT_WORD.search(words) is None:
        return Verdict.KEEP
    if mentions(words, MAYBE_CONTENT):
        return Verdict.KEEP
    if mentions(words, UNLIKELY):
        return Verdict.DROP
    if mentions(words, SMALL_WIDGET):
        return Verdict.DROP_IF_SMALL
    return Verdict.KEEP


def _holds_much_text(node: LexborNode, known_big: set[int]) -> bool:
    if node.mem_id in known_big:
        return True
    if reading_length(node.text(deep=True, separator=" ", strip=True)) < SMALL_WIDGET_CHARS:
        return False
    ancestor: LexborNode | None = node
    while ancestor is not None and ancestor.mem_id not in known_big:
        known_big.add(ancestor.mem_id)
        ancestor = ancestor.parent
    return True


def _inside_table(node: LexborNode) -> bool:
    parent = node.parent
    for _ in range(MAX_VOTE_LEVELS):
        if parent is None:
            return False
        if parent.tag in ("table", "code"):
            return True
        parent = parent.parent
    return False


def _split_divs(body: LexborNode) -> tuple[list[LexborNode], list[LexborNode]]:
    """Divs without a block element below them, and divs with one, in document order.

    Every block element marks its ancestors, stopping at the first one already marked, so each
    element is marked once: linear, and it touches only blocks and their ancestors, not the
    inline elements that are most of a page. A `:has()` selector does the same in C but costs
    depth times size: 4 s on a page nested 10,000 deep.
    """
    holds_block: set[int] = set()
    for block in body.css(BLOCK_SELECTOR_UNDER_DIV):
        parent = block.parent
        while parent is not None:
            key = parent.mem_id
            if key in holds_block:
                break
            holds_block.add(key)
            parent = parent.parent
    inline_only: list[LexborNode] = []
    with_blocks: list[LexborNode] = []
    for div in body.css("div"):
        (with_blocks if div.mem_id in holds_block else inline_only).append(div)
    return inline_only, with_blocks


class CandidateScores:
    """Votes per ancestor element, keyed by the element's identity in the parsed tree."""

    def __init__(self, strictness: Strictness, stats: TextStats) -> None:
        self.strictness = strictness
        self.stats = stats
        self.score: dict[int, float] = {}
        self.node: dict[int, LexborNode] = {}
        self.chains: dict[int, tuple[int, ...]] = {}
        self.weights = ClassWeights()

    def voted_ancestors(self, parent: LexborNode | None) -> tuple[int, ...]:
        """Keys of the elements a paragraph under `parent` votes for, nearest first, each
        registered with its base score when first met.

        Remembered per parent: the cells of a row and the paragraphs of a box share their
        ancestors, and walking up from each (a Python node per level) was most of the scoring
        of a page with 7,000 table cells.
        """
        if parent is None:
            return ()
        chain = self.chains.get(parent.mem_id)
        if chain is not None:
            return chain
        keys: list[int] = []
        ancestor: LexborNode | None = parent
        for _ in range(MAX_VOTE_LEVELS):
            if ancestor is None or ancestor.tag in (None, "html", "-document"):
                break
            key = ancestor.mem_id
            if key not in self.score:
                base = TAG_BASE_SCORE.get(ancestor.tag or "", 0)
                if self.strictness.weigh_classes:
                    base += self.weights.of(ancestor)
                self.score[key] = float(base)
                self.node[key] = ancestor
            keys.append(key)
            ancestor = ancestor.parent
        chain = self.chains[parent.mem_id] = tuple(keys)
        return chain

    def get(self, node: LexborNode) -> float | None:
        return self.score.get(node.mem_id)


def score_candidates(body: LexborNode, strictness: Strictness) -> CandidateScores:
    scores = CandidateScores(strictness, TextStats())
    inline_only, with_blocks = _split_divs(body)
    # Paragraph-like elements: Readability's list plus divs that hold only inline content.
    for element in [*body.css(SCORED_SELECTOR), *inline_only]:
        raw = element.text(deep=True)
        # A wide-script character reads as three: shorter raw text cannot reach the minimum
        # (most cells of a big data table), so it is not collapsed and measured at all; nor
        # can text under the minimum that holds no wide-script character (the next cells).
        size = len(raw)
        if size * (1 + WIDE_CHAR_EXTRA) < MIN_PARAGRAPH_CHARS:
            continue
        if size < MIN_PARAGRAPH_CHARS and WIDE_SCRIPT.search(raw) is None:
            continue
        _vote(scores, raw, element.parent)
    # Text written straight into a div beside its blocks (paragraphs split by <br><br> under
    # an image box) is paragraphs too: Readability wraps such runs in <p>; they vote as
    # paragraphs whose parent is the div.
    for div in with_blocks:
        own = div.text(deep=False)
        if len(own) >= MIN_PARAGRAPH_CHARS and not own.isspace():
            _vote(scores, own, div)
    return scores


def _vote(scores: CandidateScores, raw: str, parent: LexborNode | None) -> None:
    """A paragraph's vote for its ancestors, less for each level further up."""
    if len(raw) > LONG_RAW_CHARS and len(" ".join(raw[:LONG_RAW_CHARS].split())) >= LONGEST_VOTED_CHARS:
        # A long block (a layout cell around a whole page: 100,000 characters) earns the full
        # length vote from its first characters, so the rest is not collapsed and measured;
        # commas are never whitespace, so the raw text holds the collapsed text's.
        length, commas = LONGEST_VOTED_CHARS, comma_count(raw)
    else:
        # Measured in Latin-equivalent characters: twenty Chinese characters are a sentence.
        length, commas = measure_text(" ".join(raw.split()))
        if length < MIN_PARAGRAPH_CHARS:
            return
    vote = 1 + min(commas, MAX_VOTED_COMMAS) + min(length // 100, LONGEST_VOTED_CHARS // 100)
    score = scores.score
    for level, key in enumerate(scores.voted_ancestors(parent)):
        score[key] += vote / VOTE_DIVIDERS[level]


def pick_top_candidate(body: LexborNode, scores: CandidateScores) -> tuple[LexborNode, float]:
    """The best candidate after link-density discount, moved up when its parent is as good."""
    ranked = sorted(scores.score.items(), key=lambda item: item[1], reverse=True)
    adjusted: list[tuple[float, LexborNode]] = []
    # Link density costs a subtree walk, so only the strongest raw candidates pay for it.
    strongest = ranked[: TOP_CANDIDATES * 2]
    scores.stats.measure([scores.node[key] for key, _raw in strongest])
    for key, raw in strongest:
        node = scores.node[key]
        final = raw * (1 - scores.stats.link_density(node))
        scores.score[key] = final
        adjusted.append((final, node))
    if not adjusted:
        return body, 0.0
    adjusted.sort(key=lambda item: item[0], reverse=True)
    top_score, top = adjusted[0]
    top = _climb_to_shared_ancestor(top, top_score, adjusted[1:TOP_CANDIDATES], body)
    top_score = scores.get(top) or top_score
    # A parent scoring higher than its best child holds more of the same article.
    threshold = top_score / 3
    parent = top.parent
    last = top_score
    while parent is not None and parent.tag not in ("body", "html"):
        parent_score = scores.get(parent)
        if parent_score is None:
            parent = parent.parent
            continue
        if parent_score < threshold:
            break
        if parent_score > last:
            top, top_score = parent, parent_score
            break
        last = parent_score
        parent = parent.parent
    # An only child says nothing its parent does not: take the parent, siblings come with it.
    while top.parent is not None and top.parent.tag not in ("body", "html"):
        if len([c for c in _element_children(top.parent)]) != 1:
            break
        top = top.parent
    return top, top_score


def _climb_to_shared_ancestor(
    top: LexborNode, top_score: float, runners_up: list[tuple[float, LexborNode]], body: LexborNode
) -> LexborNode:
    """When three strong runners-up share an ancestor with the top, the article is that ancestor."""
    close = [node for score, node in runners_up if score >= top_score * 0.75]
    if len(close) < 3:
        return top
    ancestor_ids = [_ancestor_ids(node) for node in close]
    parent = top.parent
    while parent is not None and parent.tag != "body":
        key = parent.mem_id
        if sum(1 for ids in ancestor_ids if key in ids) >= 3:
            return parent
        parent = parent.parent
    return top


def _ancestor_ids(node: LexborNode) -> set[int]:
    ids: set[int] = set()
    parent = node.parent
    while parent is not None:
        ids.add(parent.mem_id)
        parent = parent.parent
    return ids


def _element_children(node: LexborNode) -> list[LexborNode]:
    children = []
    child = node.child
    while child is not None:
        if child.is_element_node or (child.is_text_node and (child.text_content or "").strip()):
            children.append(child)
        child = child.next
    return children


def gather_article(top: LexborNode, top_score: float, scores: CandidateScores) -> list[LexborNode]:
    """The top candidate plus the siblings that score like it or read like its paragraphs."""
    parent = top.parent
    if parent is None or top.tag == "body":
        return [top]
    threshold = max(10.0, top_score * 0.2)
    top_class = top.attributes.get("class") or ""
    article: list[LexborNode] = []
    for sibling in _element_children(parent):
        if sibling.mem_id == top.mem_id:
            article.append(sibling)
            continue
        if not sibling.is_element_node:
            continue
        same_kind = bool(top_class) and sibling.tag == top.tag and sibling.attributes.get("class") == top_class
        bonus = top_score * 0.2 if same_kind else 0
        score = scores.get(sibling)
        if (score is not None and score + bonus >= threshold) or (
            (sibling.tag == "p" or (same_kind and score is None)) and _reads_like_paragraph(sibling, scores.stats)
        ):
            # A sibling of the top's own kind that got no votes (the next posts of a thread,
            # their paragraphs too deep to vote this high) is taken when it reads as prose.
            article.append(sibling)
    return article


def _reads_like_paragraph(node: LexborNode, stats: TextStats) -> bool:
    text = " ".join(node.text(deep=True).split())
    density = stats.link_density(node)
    if reading_length(text) > 80:
        return density < 0.25
    return density == 0 and bool(SENTENCE_END.search(text))


def find_main_content(html: str) -> tuple[LexborHTMLParser, list[LexborNode]]:
    """Parse and return the tree with the nodes holding the page's main content, in order.

    Each pass parses afresh, since pruning mutates the tree; the first pass that finds a
    reasonable amount of text wins, otherwise the pass that found the most.
    """
    best: tuple[int, LexborHTMLParser, list[LexborNode]] | None = None
    for strictness in PASSES:
        tree = LexborHTMLParser(html)
        body = tree.body
        if body is None:
            return tree, []
        remove_hidden_and_junk(tree)
        if strictness.strip_unlikely:
            remove_unlikely_candidates(body)
        scores = score_candidates(body, strictness)
        top, top_score = pick_top_candidate(body, scores)
        article = gather_article(top, top_score, scores)
        article = [*lead_blocks(top, article, scores.stats), *article]
        clean_article(article, strictness)
        if surely_holds(article, MIN_ARTICLE_CHARS):
            return tree, article
        found = sum(text_length(node) for node in article)
        if found >= MIN_ARTICLE_CHARS:
            return tree, article
        if best is None or found > best[0]:
            best = (found, tree, article)
    assert best is not None
    return best[1], best[2]
