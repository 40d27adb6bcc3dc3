"""Main-content detection for web_fetch: which part of a parsed page is the article.

Owns the page-chrome rules (what is hidden, what is boilerplate) and the scoring that picks the
element holding the body text: paragraphs vote for their ancestors, votes are discounted by link
density and by class/id words, and the best candidate is taken with the siblings that belong to
it (the approach of Mozilla's Readability, reimplemented over selectolax). It only reads and
prunes an already parsed tree: it never parses bytes, renders markdown or touches the network.
Every loop is iterative or bounded, so a 10,000-deep page cannot exhaust the Python stack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from selectolax.lexbor import LexborHTMLParser, LexborNode

# Never content for a reader: code, embedded documents, drawings and form controls.
JUNK_TAGS = [
    "script", "style", "noscript", "template", "iframe", "svg", "canvas", "object", "embed",
    "input", "select", "textarea", "button", "link", "meta", "dialog", "math",
]  # fmt: skip
# Landmarks that are chrome on every site; a <header> is judged later, since inside an
# article it carries the headline.
CHROME_TAGS = ["nav", "aside", "footer"]
CHROME_ROLES = (
    "navigation", "menu", "menubar", "complementary", "alert", "alertdialog", "dialog",
    "banner", "contentinfo", "search",
)  # fmt: skip
HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.I)

# Class/id words (Readability's lists, widened with consent and share bars). Matched as
# substrings of the lowercased class and id: `in` is ten times faster than a case-insensitive
# regex alternation, which dominated the run time on pages with long class lists.
UNLIKELY = (
    "-ad-",
    "ai2html",
    "banner",
    "breadcrumb",
    "combx",
    "comment",
    "community",
    "cover-wrap",
    "disqus",
    "extra",
    "footer",
    "gdpr",
    "header",
    "legends",
    "menu",
    "related",
    "remark",
    "replies",
    "rss",
    "shoutbox",
    "sidebar",
    "skyscraper",
    "social",
    "sponsor",
    "supplemental",
    "ad-break",
    "agegate",
    "pagination",
    "pager",
    "popup",
    "yom-remote",
    "cookie",
    "consent",
    "newsletter",
    "share",
    "sharing",
    "subscribe",
    "signup",
    "promo",
    "outbrain",
    "taboola",
    "recirc",
)
MAYBE_CONTENT = ("and", "article", "body", "column", "content", "main", "shadow", "mathjax")
NEGATIVE = (
    "-ad-",
    "hidden",
    "banner",
    "combx",
    "comment",
    "com-",
    "contact",
    "footer",
    "gdpr",
    "masthead",
    "media",
    "meta",
    "outbrain",
    "promo",
    "related",
    "scroll",
    "share",
    "shoutbox",
    "sidebar",
    "skyscraper",
    "sponsor",
    "shopping",
    "tags",
    "widget",
    "cookie",
    "consent",
    "newsletter",
    "subscribe",
    "social",
    "byline",
    "author",
)
POSITIVE = (
    "article",
    "body",
    "content",
    "entry",
    "hentry",
    "h-entry",
    "main",
    "page",
    "pagination",
    "post",
    "text",
    "blog",
    "story",
)
SHARE_BAR_CANDIDATES = ", ".join(
    f'[{attribute}*="{word}" i]' for word in ("share", "sharing", "social") for attribute in ("class", "id")
)
SHARE_BAR = re.compile(r"\b(share|sharing|social|sharedaddy)\b")

SCORED_SELECTOR = "p, pre, td, section, h2, h3, h4, h5, h6"
# Divs with none of these below them hold only inline content and read as paragraphs.
BLOCK_TAGS_UNDER_DIV = frozenset({"blockquote", "dl", "div", "img", "ol", "p", "pre", "table", "ul"})
TAG_BASE_SCORE = {
    "div": 5, "pre": 3, "td": 3, "blockquote": 3,
    "address": -3, "ol": -3, "ul": -3, "dl": -3, "dd": -3, "dt": -3, "li": -3, "form": -3,
    "h1": -5, "h2": -5, "h3": -5, "h4": -5, "h5": -5, "h6": -5, "th": -5,
}  # fmt: skip
MIN_PARAGRAPH_CHARS = 25
MAX_VOTE_LEVELS = 5
TOP_CANDIDATES = 5
# A small form is a search box or a comment form; a big one is an ASP.NET page wrapper.
SMALL_FORM_CHARS = 250
# Below this much text the strict pass probably threw the article away: retry looser.
MIN_ARTICLE_CHARS = 500


@dataclass(frozen=True, slots=True)
class Strictness:
    """Which of the lossy rules a pass applies; later passes drop them, like Readability."""

    strip_unlikely: bool
    weigh_classes: bool
    clean_conditionally: bool


PASSES = (
    Strictness(strip_unlikely=True, weigh_classes=True, clean_conditionally=True),
    Strictness(strip_unlikely=False, weigh_classes=True, clean_conditionally=True),
    Strictness(strip_unlikely=False, weigh_classes=False, clean_conditionally=True),
    Strictness(strip_unlikely=False, weigh_classes=False, clean_conditionally=False),
)


def text_length(node: LexborNode) -> int:
    """Characters of visible text, each text node trimmed and joined by one space (in C)."""
    return len(node.text(deep=True, separator=" ", strip=True))


class TextStats:
    """Text and link lengths per element, cached for one pass over one tree.

    Scoring and cleaning ask about the same big wrappers many times; each anchor's length is
    measured once, so a candidate's link density costs one selector call, not a text walk
    per link.
    """

    def __init__(self, body: LexborNode) -> None:
        self.anchor_chars = {anchor.mem_id: len(anchor.text(deep=True, strip=True)) for anchor in body.css("a")}
        self.text_chars: dict[int, int] = {}

    def length(self, node: LexborNode) -> int:
        key = node.mem_id
        cached = self.text_chars.get(key)
        if cached is None:
            cached = self.text_chars[key] = text_length(node)
        return cached

    def link_density(self, node: LexborNode) -> float:
        """Share of the text that sits inside links: high for menus and related-link lists."""
        total = self.length(node)
        if total == 0:
            return 0.0
        anchors = self.anchor_chars
        linked = sum(anchors.get(anchor.mem_id, 0) for anchor in node.css("a"))
        return min(1.0, linked / total)


def mentions(words: str, keywords: tuple[str, ...]) -> bool:
    """Whether lowercased class/id words contain any of the keywords."""
    return any(keyword in words for keyword in keywords)


def class_and_id(node: LexborNode) -> str:
    return f"{node.attrs.get('class') or ''} {node.id or ''}".lower()


def class_weight(node: LexborNode) -> int:
    """+25 for an article-like class or id, -25 for a chrome-like one (each counted once)."""
    weight = 0
    for name in (node.attributes.get("class"), node.attributes.get("id")):
        if not name:
            continue
        lowered = name.lower()
        if mentions(lowered, NEGATIVE) or "hid" in lowered.split():
            weight -= 25
        if mentions(lowered, POSITIVE):
            weight += 25
    return weight


def remove_hidden_and_junk(tree: LexborHTMLParser) -> None:
    """Drop what a reader never sees: junk tags, hidden elements, chrome landmarks.

    Every removal loop runs innermost first: `decompose` frees the subtree, so a nested match
    must go before its ancestor does.
    """
    for node in reversed(tree.css(", ".join(JUNK_TAGS))):
        node.decompose()
    hidden = '[hidden], [aria-hidden="true" i], [style*="none" i], [style*="hidden" i]'
    for node in reversed(tree.css(hidden)):
        attrs = node.attributes
        style = attrs.get("style") or ""
        if "hidden" in attrs or attrs.get("aria-hidden") is not None or HIDDEN_STYLE.search(style):
            node.decompose()
    for node in reversed(tree.css(", ".join(CHROME_TAGS))):
        node.decompose()
    # One cheap selector, then the role test in Python: an 11-way attribute selector is slower.
    for node in reversed(tree.css("[role]")):
        if (node.attributes.get("role") or "").strip().lower() in CHROME_ROLES:
            node.decompose()
    for form in reversed(tree.css("form")):
        # ASP.NET pages wrap the whole body in one <form>: only small forms are chrome.
        if text_length(form) < SMALL_FORM_CHARS:
            form.decompose()


def remove_unlikely_candidates(body: LexborNode) -> None:
    """Drop elements whose class/id says menu, comments, share bar... unless it also says content."""
    # Sites repeat the same few class lists thousands of times: judge each list once.
    verdicts: dict[tuple[str | None, str | None], bool] = {}
    for node in reversed(body.css("[class], [id]")):
        key = (node.attrs.get("class"), node.id)
        unlikely = verdicts.get(key)
        if unlikely is None:
            words = f"{key[0] or ''} {key[1] or ''}".lower()
            unlikely = mentions(words, UNLIKELY) and not mentions(words, MAYBE_CONTENT)
            verdicts[key] = unlikely
        if unlikely and node.tag in ("body", "html", "a", "article", "main"):
            continue
        if unlikely and not _inside_table(node):
            node.decompose()


def _inside_table(node: LexborNode) -> bool:
    parent = node.parent
    for _ in range(MAX_VOTE_LEVELS):
        if parent is None:
            return False
        if parent.tag in ("table", "code"):
            return True
        parent = parent.parent
    return False


def _inline_only_divs(body: LexborNode) -> list[LexborNode]:
    """Divs without a block element below them, in document order.

    One bottom-up pass (reversed pre-order visits every node after its descendants). A `:has()`
    selector does the same in C but costs depth times size: 4 s on a page nested 10,000 deep.
    """
    holds_block: dict[int, bool] = {}
    found: list[LexborNode] = []
    for node in reversed(list(body.traverse(include_text=False))):
        below = holds_block.pop(node.mem_id, False)
        if node.tag == "div" and not below:
            found.append(node)
        parent = node.parent
        if parent is not None and (below or node.tag in BLOCK_TAGS_UNDER_DIV):
            holds_block[parent.mem_id] = True
    found.reverse()
    return found


def _scored_elements(body: LexborNode) -> list[LexborNode]:
    """Paragraph-like elements: Readability's list plus divs that hold only inline content."""
    return [*body.css(SCORED_SELECTOR), *_inline_only_divs(body)]


class CandidateScores:
    """Votes per ancestor element, keyed by the element's identity in the parsed tree."""

    def __init__(self, strictness: Strictness, stats: TextStats) -> None:
        self.strictness = strictness
        self.stats = stats
        self.score: dict[int, float] = {}
        self.node: dict[int, LexborNode] = {}

    def add_vote(self, node: LexborNode, vote: float) -> None:
        key = node.mem_id
        if key not in self.score:
            base = TAG_BASE_SCORE.get(node.tag or "", 0)
            if self.strictness.weigh_classes:
                base += class_weight(node)
            self.score[key] = float(base)
            self.node[key] = node
        self.score[key] += vote

    def get(self, node: LexborNode) -> float | None:
        return self.score.get(node.mem_id)


def score_candidates(body: LexborNode, strictness: Strictness) -> CandidateScores:
    scores = CandidateScores(strictness, TextStats(body))
    for element in _scored_elements(body):
        text = " ".join(element.text(deep=True).split())
        if len(text) < MIN_PARAGRAPH_CHARS:
            continue
        vote = 1 + text.count(",") + text.count("\uff0c") + min(len(text) // 100, 3)
        ancestor = element.parent
        for level in range(MAX_VOTE_LEVELS):
            if ancestor is None or ancestor.tag in (None, "html", "-document"):
                break
            divider = 1 if level == 0 else 2 if level == 1 else level * 3
            scores.add_vote(ancestor, vote / divider)
            ancestor = ancestor.parent
    return scores


def pick_top_candidate(body: LexborNode, scores: CandidateScores) -> tuple[LexborNode, float]:
    """The best candidate after link-density discount, moved up when its parent is as good."""
    ranked = sorted(scores.score.items(), key=lambda item: item[1], reverse=True)
    adjusted: list[tuple[float, LexborNode]] = []
    # Link density costs a subtree walk, so only the strongest raw candidates pay for it.
    for key, raw in ranked[: TOP_CANDIDATES * 2]:
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
        bonus = top_score * 0.2 if top_class and sibling.attributes.get("class") == top_class else 0
        score = scores.get(sibling)
        if (score is not None and score + bonus >= threshold) or (
            sibling.tag == "p" and _reads_like_paragraph(sibling, scores.stats)
        ):
            article.append(sibling)
    return article


def _reads_like_paragraph(node: LexborNode, stats: TextStats) -> bool:
    text = " ".join(node.text(deep=True).split())
    density = stats.link_density(node)
    if len(text) > 80:
        return density < 0.25
    return density == 0 and bool(re.search(r"\.( |$)", text))


def clean_article(nodes: list[LexborNode], scores: CandidateScores) -> None:
    """Drop share bars, link lists and other chrome left inside the chosen content.

    Elements are visited innermost first: removing an element frees its subtree, so a
    descendant must never be touched after its ancestor went.
    """
    for root in nodes:
        for node in reversed(root.css(SHARE_BAR_CANDIDATES)):
            if node.mem_id == root.mem_id:
                continue
            if SHARE_BAR.search(class_and_id(node)) and text_length(node) < 500:
                node.decompose()
        if scores.strictness.clean_conditionally:
            for node in reversed(root.css("table, ul, ol, div, section, header, form")):
                if node.mem_id != root.mem_id and _is_fishy(node, scores):
                    node.decompose()


def _is_fishy(node: LexborNode, scores: CandidateScores) -> bool:
    """Readability's conditional cleaning: lists and boxes that are mostly links or media."""
    weight = class_weight(node) if scores.strictness.weigh_classes else 0
    if weight < 0:
        return True
    # Measured afresh: the innermost-first walk may have emptied parts of this element.
    text = " ".join(node.text(deep=True).split())
    if text.count(",") >= 10:
        return False
    anchors = scores.stats.anchor_chars
    linked = sum(anchors.get(anchor.mem_id, 0) for anchor in node.css("a"))
    density = min(1.0, linked / len(text)) if text else 0.0
    tag = node.tag
    if tag == "header":
        return density > 0.5
    if tag in ("ul", "ol"):
        return density > 0.5 and weight < 25
    paragraphs = len(node.css("p"))
    images = len(node.css("img"))
    if images > 1 and paragraphs / images < 0.5 and not node.css_first("figure"):
        return True
    if len(node.css("li")) - 100 > paragraphs:
        return True
    if len(text) < MIN_PARAGRAPH_CHARS and images == 0 and tag != "table":
        return not node.css_first("pre, code, h1, h2, h3, h4, h5, h6")
    if weight < 25 and density > 0.2:
        return True
    return weight >= 25 and density > 0.5


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
        clean_article(article, scores)
        found = sum(text_length(node) for node in article)
        if found >= MIN_ARTICLE_CHARS:
            return tree, article
        if best is None or found > best[0]:
            best = (found, tree, article)
    assert best is not None
    return best[1], best[2]
