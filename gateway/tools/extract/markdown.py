"""HTML to markdown for web_fetch: the page's main content as clean markdown plus its links.

Owns the pipeline of one conversion: the main content (`main_content`), the title line, link
targets resolved against `<base href>` and the page URL, the output format (markdown, text or
cleaned HTML), the reference list of `links: references`, and the cut at `max_chars`. The
markdown rules per element are `markdown_render`'s. It is pure: text in, `Extraction` out; it
never touches the network, never reads files, and never lets an exception other than
`GatewayError` escape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urljoin

from selectolax.lexbor import LexborHTMLParser

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.extract.main_content import find_main_content
from gateway.tools.extract.main_content_html import main_content_html
from gateway.tools.extract.markdown_output import Link, LinkCollector, LinkReferences, MarkdownWriter, OutputFull
from gateway.tools.extract.markdown_render import MarkdownRenderer
from gateway.tools.extract.render_options import DEFAULT_RENDER_OPTIONS, RenderOptions

__all__ = ["Extraction", "Link", "RenderOptions", "html_to_markdown", "page_title"]

DEFAULT_MAX_CHARS = 400_000
DEFAULT_MAX_LINKS = 20

REFERENCE_USE = re.compile(r"\]\[(\d+)\]")


@dataclass(frozen=True, slots=True)
class Extraction:
    title: str
    markdown: str
    links: tuple[Link, ...]
    source_truncated: bool


def page_title(tree: LexborHTMLParser) -> str:
    for selector, attribute in (('meta[property="og:title"]', "content"), ("title", None)):
        node = tree.css_first(selector)
        if node is None:
            continue
        raw = node.attributes.get(attribute) if attribute else node.text(deep=True)
        title = " ".join((raw or "").split())
        if title:
            return title
    heading = tree.css_first("h1")
    return " ".join(heading.text(deep=True).split()) if heading is not None else ""


def effective_base_url(tree: LexborHTMLParser, base_url: str) -> str:
    """`<base href>` resolved against the page URL (HTML's document base URL)."""
    base = tree.css_first("base[href]")
    href = base.attributes.get("href") if base is not None else None
    if not href or not href.strip():
        return base_url
    try:
        return urljoin(base_url, href.strip())
    except ValueError:
        return base_url


def html_to_markdown(
    html: str,
    base_url: str,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_links: int = DEFAULT_MAX_LINKS,
    options: RenderOptions = DEFAULT_RENDER_OPTIONS,
) -> Extraction:
    """The main content of `html` as markdown (or text, or cleaned HTML, per `options`), headed
    by the title (`# title` in markdown, a plain line in text, none in HTML), with up to max_links
    links."""
    if max_chars < 1 or max_links < 0:
        raise GatewayError(ErrorCode.INVALID_INPUT, "max_chars must be positive, max_links >= 0")
    try:
        return _extract(html, base_url, max_chars, max_links, options)
    except GatewayError:
        raise
    except (ValueError, TypeError, RuntimeError, MemoryError, UnicodeError) as exc:
        # selectolax reports unparsable input this way; the caller gets one refusal code.
        raise GatewayError(ErrorCode.UNSUPPORTED_CONTENT, f"page could not be parsed: {exc}") from exc


def _extract(html: str, base_url: str, max_chars: int, max_links: int, options: RenderOptions) -> Extraction:
    tree, article = find_main_content(html)
    title = page_title(tree)
    collector = LinkCollector(effective_base_url(tree, base_url), max_links)
    if options.format == "html":
        markup, truncated = main_content_html(article, collector, max_chars)
        return Extraction(title, markup, tuple(collector.links), truncated)
    references = LinkReferences() if options.links == "references" and options.format == "markdown" else None
    writer = MarkdownWriter(max_chars)
    truncated = False
    try:
        if title:
            writer.block(title if options.format == "text" else f"# {title}")
        renderer = MarkdownRenderer(writer, collector, title, options, references)
        for node in article:
            renderer.render(node)
        writer.flush_paragraph()
    except OutputFull:
        truncated = True
    markdown = writer.markdown()
    if truncated:
        markdown = _cut(markdown, max_chars)
    if references is not None and references.numbers:
        markdown, truncated = _with_definitions(markdown.strip(), references, max_chars, truncated=truncated)
    return Extraction(
        title=title,
        markdown=markdown.strip() + "\n" if markdown.strip() else "",
        links=tuple(collector.links),
        source_truncated=truncated,
    )


def _with_definitions(
    markdown: str, references: LinkReferences, max_chars: int, *, truncated: bool
) -> tuple[str, bool]:
    """The markdown with its `[n]: url` list at the end, the whole still within max_chars."""
    definitions = references.definitions(len(references.numbers))
    if len(markdown) + 2 + len(definitions) > max_chars:
        # Room for the list is made by cutting the text; only the references still used stay.
        markdown = _cut(markdown, max(1, max_chars - 2 - len(definitions))).rstrip()
        used = [int(number) for number in REFERENCE_USE.findall(markdown)]
        definitions = references.definitions(max(used, default=0))
        truncated = True
    if not definitions:
        return markdown, truncated
    return f"{markdown}\n\n{definitions}"[:max_chars], truncated


def _cut(markdown: str, max_chars: int) -> str:
    """At most max_chars, ending at a line break when one is reasonably close."""
    head = markdown[:max_chars]
    newline = head.rfind("\n")
    return head[:newline] if newline > max_chars // 2 else head
