"""The chosen main content as cleaned HTML, for web_fetch's `format: html`.

Owns what of the page's own markup an agent gets: the elements of the main content with only
the attributes that carry meaning (links, image sources and alt text, table spans, list starts),
every link and image source made absolute, dead links (`javascript:` ...) reduced to their
words, comments dropped, capped at max_chars on a tag boundary. It edits the pruned tree it is
given (which is thrown away after rendering); it never chooses the content or parses a page.
"""

from __future__ import annotations

import re

from selectolax.lexbor import LexborNode

from gateway.tools.extract.markdown_output import LinkCollector

KEPT_ATTRIBUTES = frozenset(
    {"href", "src", "alt", "title", "colspan", "rowspan", "start", "scope", "datetime", "lang", "dir"}
)
URL_ATTRIBUTES = ("href", "src")
COMMENT = re.compile(r"<!--.*?-->", re.S)
BLANK_LINES = re.compile(r"\n\s*\n+")


def main_content_html(article: list[LexborNode], links: LinkCollector, max_chars: int) -> tuple[str, bool]:
    """The article nodes as one HTML string and whether max_chars cut it."""
    pieces: list[str] = []
    length = 0
    for root in article:
        for element in root.css("*"):
            _clean_element(element, links)
        markup = BLANK_LINES.sub("\n", COMMENT.sub("", root.html or "")).strip()
        if not markup:
            continue
        pieces.append(markup)
        length += len(markup) + 1
        if length > max_chars:
            break
    whole = "\n".join(pieces)
    if len(whole) <= max_chars:
        return whole, False
    head = whole[:max_chars]
    # End on a tag boundary when one is reasonably close, so no tag is cut in half.
    boundary = head.rfind(">")
    return (head[: boundary + 1] if boundary > max_chars // 2 else head), True


def _clean_element(element: LexborNode, links: LinkCollector) -> None:
    if element.tag == "a" and _is_permalink(element):
        element.decompose()
        return
    attributes = element.attrs
    for name in [name for name in attributes if name.lower() not in KEPT_ATTRIBUTES]:
        del attributes[name]
    for name in URL_ATTRIBUTES:
        if name not in attributes:
            continue
        url = links.resolve(attributes[name])
        if url is None:
            del attributes[name]
            continue
        attributes[name] = url
        if name == "href" and element.tag == "a":
            links.record(" ".join(element.text(deep=True).split()), url)


def _is_permalink(anchor: LexborNode) -> bool:
    """A heading permalink or a footnote's backlink: an in-page link of symbols only (¶, #, ^)."""
    if (anchor.attributes.get("href") or "").lstrip()[:1] != "#":
        return False
    return not any(char.isalnum() for char in anchor.text(deep=True))
