"""The vocabulary of main-content detection: tags, roles and class/id words, and text measures.

Owns the word lists that say "chrome" or "content" (Mozilla Readability's lists, widened with
consent and share bars), the class/id weight derived from them, the strictness of each pass,
and the script-aware ways of measuring text that scoring and cleaning share. Pure functions of
strings and single nodes: it never walks or prunes a tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from selectolax.lexbor import LexborNode

# Never content for a reader: code, embedded documents, drawings, form controls and ruby
# annotations (<rt> readings above Japanese text split its words). <math> is
# not here: on a mathematics page the formulas are the text (the renderer writes their tokens).
JUNK_TAGS = (
    "script", "style", "noscript", "template", "iframe", "svg", "canvas", "object", "embed",
    "input", "select", "textarea", "button", "link", "meta", "dialog", "rt", "rp",
)  # fmt: skip
# Landmarks that are chrome on every site; a <header> is judged later, since inside an
# article it carries the headline.
CHROME_TAGS = ("nav", "aside", "footer")
CHROME_ROLES = (
    "navigation", "menu", "menubar", "complementary", "alert", "alertdialog", "dialog",
    "banner", "contentinfo", "search",
)  # fmt: skip
HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.I)


def any_of(words: tuple[str, ...]) -> re.Pattern[str]:
    """A regex finding any of the words as a substring, written as a trie of their letters.

    Python's engine tries each branch of a flat alternation at every position; sharing the
    prefixes ("co(?:lumn|ntent|mment|...)") makes the search about three times faster, and it
    runs once per distinct class/id string of a page (thousands on a wiki page, ids unique).
    """
    trie: dict[str, dict[str, Any]] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}
    return re.compile(_trie_pattern(trie))


def _trie_pattern(node: dict[str, dict[str, Any]]) -> str:
    # Recursive, but only as deep as the longest word (under 20 letters).
    branches = [re.escape(char) + _trie_pattern(child) for char, child in sorted(node.items()) if char]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    # A word ends here and longer ones go on: the rest is optional (any word found is enough).
    return f"(?:{body})?" if "" in node else body


# Class/id words, matched as substrings of the lowercased class and id: `in` is ten times faster
# than a case-insensitive regex alternation, which dominated the run time on pages with long
# class lists. UNLIKELY is Readability's list plus third-party recirculation widgets.
UNLIKELY = (
    "-ad-", "ai2html", "banner", "breadcrumb", "combx", "comment", "community", "cover-wrap",
    "disqus", "extra", "footer", "gdpr", "header", "legends", "menu", "related", "remark",
    "replies", "rss", "shoutbox", "sidebar", "skyscraper", "social", "sponsor", "supplemental",
    "ad-break", "agegate", "pagination", "pager", "popup", "yom-remote", "outbrain", "taboola",
    "recirc",
)  # fmt: skip
# Words naming small widgets (a share bar, a cookie notice, a sign-up box). Sites also put them
# on wrappers that hold the article (`gigya-share-btns-2_gig_containerParent` around The
# Independent's body text), so they mark chrome only while the element is small.
SMALL_WIDGET = (
    "cookie", "consent", "newsletter", "share", "sharing", "subscribe", "signup", "promo",
    # Site notices and furniture: disclaimers, licence and copyright lines, star ratings,
    # calls to action, alerts, a poster's signature block, embedded cards of other pages.
    "disclaimer", "copyright", "licen", "rating", "-cta", "alert", "signature", "user-info", "embed",
)  # fmt: skip
SMALL_WIDGET_CHARS = 500
# Class/id words of boxes that are never the article, judged inside the chosen content: teaser
# cards, sidebars, captions, footers, author boxes, social buttons.
NAMED_CHROME = ("teaser", "sidebar", "caption", "footer", "author", "social")
NAMED_CHROME_SELECTOR = ", ".join(
    f'[{attribute}*="{word}" i]' for word in NAMED_CHROME for attribute in ("class", "id")
)
MAYBE_CONTENT = ("and", "article", "body", "column", "content", "main", "shadow", "mathjax")
NEGATIVE = (
    "-ad-", "hidden", "banner", "combx", "comment", "com-", "contact", "footer", "gdpr",
    "masthead", "media", "meta", "outbrain", "promo", "related", "scroll", "share", "shoutbox",
    "sidebar", "skyscraper", "sponsor", "shopping", "tags", "widget", "cookie", "consent",
    "newsletter", "subscribe", "social", "byline", "author",
)  # fmt: skip
POSITIVE = (
    "article", "body", "content", "entry", "hentry", "h-entry", "main", "page", "pagination",
    "post", "text", "blog", "story",
)  # fmt: skip
# Any word of the verdict lists at all: most class/id strings (ids above all, unique per
# element) hold none, and one search rules out all three lists at once instead of about fifty
# `in` tests. A hit only means the lists must be looked at in order.
ANY_VERDICT_WORD = any_of((*MAYBE_CONTENT, *UNLIKELY, *SMALL_WIDGET))
# The same for names_weight's lists ("hid" covers its whole-word test for "hid").
ANY_WEIGHT_WORD = any_of((*NEGATIVE, *POSITIVE, "hid"))
SHARE_BAR_CANDIDATES = ", ".join(
    f'[{attribute}*="{word}" i]' for word in ("share", "sharing", "social") for attribute in ("class", "id")
)
SHARE_BAR = re.compile(r"\b(share|sharing|social|sharedaddy)\b")

# Readability's commas (Latin, Arabic, small, vertical and fullwidth forms) plus the
# ideographic comma 、 that Chinese and Japanese use to separate list items.
COMMAS = (",", "\u060c", "\ufe50", "\ufe10", "\ufe11", "\u2e41", "\u2e34", "\u2e32", "\uff0c", "\u3001")
# Han, kana, hangul and fullwidth forms: one such character carries about as much as a short
# Latin word, and these scripts put no spaces between words.
WIDE_SCRIPT = re.compile(r"[\u1100-\u11ff\u2e80-\u9fff\ua960-\ua97f\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")
# Extra weight of a wide-script character, so that a CJK sentence measures like its translation.
WIDE_CHAR_EXTRA = 2
COMMA_SET = frozenset(COMMAS)
# Commas that are not wide-script characters themselves (the ideographic and fullwidth ones are).
NARROW_COMMAS = frozenset(comma for comma in COMMAS if WIDE_SCRIPT.match(comma) is None)
# Wide-script characters and commas of any script, found together in one scan.
WIDE_OR_COMMA = re.compile(WIDE_SCRIPT.pattern[:-1] + "".join(COMMAS) + "]")
SENTENCE_END = re.compile(r"[.!?]( |$)|[\u3002\uff01\uff1f\uff0e]")


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


def comma_count(text: str) -> int:
    """Commas of any script: each one is a clause, and clauses are what articles are made of."""
    if text.isascii():
        return text.count(",")
    return sum(map(text.count, COMMAS))


def reading_length(text: str) -> int:
    """Length in Latin-equivalent characters: a CJK character counts as three."""
    if text.isascii():
        return len(text)
    return len(text) + WIDE_CHAR_EXTRA * len(WIDE_SCRIPT.findall(text))


def measure_text(text: str) -> tuple[int, int]:
    """`reading_length` and `comma_count` of one text, in one pass over non-ASCII text."""
    if text.isascii():
        return len(text), text.count(",")
    special = WIDE_OR_COMMA.findall(text)
    if not special:
        return len(text), 0
    commas = narrow = 0
    for char in special:
        if char in COMMA_SET:
            commas += 1
            narrow += char in NARROW_COMMAS
    return len(text) + WIDE_CHAR_EXTRA * (len(special) - narrow), commas


def mentions(words: str, keywords: tuple[str, ...]) -> bool:
    """Whether lowercased class/id words contain any of the keywords."""
    return any(keyword in words for keyword in keywords)


def class_and_id(node: LexborNode) -> str:
    return f"{node.attrs.get('class') or ''} {node.id or ''}".lower()


def names_weight(class_name: str | None, element_id: str | None) -> int:
    """+25 for an article-like class or id, -25 for a chrome-like one (each counted once)."""
    weight = 0
    for name in (class_name, element_id):
        if not name:
            continue
        lowered = name.lower()
        if ANY_WEIGHT_WORD.search(lowered) is None:
            continue
        if mentions(lowered, NEGATIVE) or "hid" in lowered.split():
            weight -= 25
        if mentions(lowered, POSITIVE):
            weight += 25
    return weight


class ClassWeights:
    """The class/id weight of elements, remembered for one pass: sites repeat the same few class
    lists thousands of times (a gallery page: a thousand divs, a handful of distinct classes)."""

    def __init__(self) -> None:
        self.known: dict[tuple[str | None, str | None], int] = {}

    def of(self, node: LexborNode) -> int:
        attributes = node.attributes
        key = (attributes.get("class"), attributes.get("id"))
        weight = self.known.get(key)
        if weight is None:
            weight = self.known[key] = names_weight(*key)
        return weight
