"""The markdown renderer of web_fetch: one walk over the chosen content, driving the writer.

Owns the markdown rules per element (headings, paragraphs, lists, links, code, maths, tables,
quotes, definition terms, image alt text), in-page link handling (permalinks, citation marks)
and the link styles and formats of `RenderOptions`. The page-level pipeline (main content,
title, base URL, reference list) is `markdown`'s; the output buffer is `markdown_output`'s.
The walk uses an explicit stack, so nesting depth is bounded by memory, not by Python's
recursion limit; it never parses, prunes or touches the network.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from types import MappingProxyType

from selectolax.lexbor import LexborNode

from gateway.tools.extract.markdown_output import (
    Container,
    LinkCollector,
    LinkReferences,
    ListState,
    MarkdownWriter,
    OutputFull,
)
from gateway.tools.extract.markdown_tables import is_layout_table, row_cells, table_row
from gateway.tools.extract.render_options import DEFAULT_RENDER_OPTIONS, RenderOptions

BLOCK_TAGS = frozenset(
    {
        "address", "article", "aside", "blockquote", "body", "center", "dd", "details", "dialog",
        "dir", "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "header",
        "hgroup", "li", "main", "menu", "nav", "ol", "p", "pre", "section", "summary", "table",
        "tbody", "thead", "tfoot", "tr", "td", "th", "caption", "ul", "legend",
    }
)  # fmt: skip
# Inline elements that add nothing to markdown: their text flows into the paragraph.
PLAIN_INLINE_TAGS = frozenset(
    {
        "span", "b", "strong", "em", "i", "u", "small", "sup", "sub", "abbr", "cite", "mark",
        "time", "label", "font", "q", "s", "del", "ins", "dfn", "bdi", "bdo", "data", "var",
        "wbr", "big", "nobr",
    }
)  # fmt: skip
# Block elements with no rule of their own: a paragraph break before and after. The render
# loop handles them without a call to `enter`, as it does links and plain inline elements.
PLAIN_BLOCK_TAGS = BLOCK_TAGS - {"blockquote", "dir", "dt", "li", "menu", "ol", "pre", "table", "ul"}
HEADING_LEVEL = MappingProxyType({"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6})
SKIPPED_TAGS = frozenset(
    {
        "script", "style", "noscript", "template", "iframe", "svg", "canvas", "input", "select",
        "textarea", "button", "head", "object", "embed",
    }
)  # fmt: skip
# Links an agent cannot follow: they keep their words and lose the target.
# MathML's token elements: identifiers, numbers, operators, text, spaces and string literals.
MATH_TOKENS = "mi, mn, mo, mtext, ms"
# A heading this long found inside the title repeats it (shorter ones are words like "News").
TITLE_MATCH_MIN_CHARS = 20
# Alt text up to this long is a label ("Logo", "Step 3"); longer, a description of the picture.
ALT_LABEL_CHARS = 40
ALT_CONTEXT_LEVELS = 6
ALT_FORMULA = re.compile(r"\\[a-z]+|[{}^_=]")
CODE_LANGUAGE = re.compile(r"(?:^|\s)(?:language|lang)-([\w+#.-]+)", re.I)
# An in-page link that is a citation mark ([12], [a], [note 3]): its words stay, not the link.
CITATION_MARK = re.compile(r"^\[?(?:\d{1,4}|[a-z]{1,2}|\w+ \d{1,4})\]?$", re.I)


# Work to do when an element closes: the explicit stack's return address.
ExitAction = Callable[[], None]


def _skip_children() -> None:
    return None


# Returned by `enter` for elements whose children must not be walked.
SKIP_CHILDREN: ExitAction = _skip_children


class MarkdownRenderer:
    """Walks a subtree with an explicit stack and drives the writer."""

    def __init__(
        self,
        writer: MarkdownWriter,
        links: LinkCollector,
        title: str = "",
        options: RenderOptions = DEFAULT_RENDER_OPTIONS,
        references: LinkReferences | None = None,
    ) -> None:
        self.writer = writer
        self.links = links
        # The page title already heads the output; a first heading repeating it is dropped.
        self.pending_title = title
        self.options = options
        self.plain = options.format == "text"
        # None: links are written inline (or not at all, for `links: none` and text).
        self.references = references
        self.bare_links = self.plain or options.links == "none"
        self.in_heading = 0

    def render(self, root: LexborNode) -> None:
        # Stack items: a node to enter, or a callable to run when its element closes. Text
        # nodes, links and plain inline and block elements (most of any page) are handled in
        # this loop, without a call to `enter`: this loop runs once per node of the article.
        stack: list[LexborNode | ExitAction] = [root]
        pop = stack.pop
        push = stack.append
        inline = self.writer.inline
        plain_inline = PLAIN_INLINE_TAGS
        plain_block = PLAIN_BLOCK_TAGS
        flush = self.writer.flush_paragraph
        close_link = self._close_link
        enter = self.enter
        while stack:
            item = pop()
            if not isinstance(item, LexborNode):
                item()
                continue
            tag = item.tag
            if tag == "-text":
                # Whitespace runs are collapsed when the paragraph is flushed; only newlines
                # matter here, since "\n" in the inline buffer stands for <br>.
                text = item.text_content
                if text:
                    inline.append(text.replace("\n", " ") if "\n" in text else text)
                continue
            if tag == "a":
                # An anchor without a target is only its words. A partial, not a lambda: one
                # call fewer per link, and pages have thousands.
                href = item.attrs.get("href")
                if href is not None:
                    push(partial(close_link, len(inline), href))
            elif tag in plain_block:
                flush()
                push(flush)
            elif tag not in plain_inline:
                exit_action = enter(item, tag)
                if exit_action is SKIP_CHILDREN:
                    continue
                if exit_action is not None:
                    push(exit_action)
            child = item.last_child
            while child is not None:
                push(child)
                child = child.prev

    def enter(self, node: LexborNode, tag: str | None) -> ExitAction | None:
        writer = self.writer
        if tag is None or tag.startswith("-") or tag in SKIPPED_TAGS:
            return SKIP_CHILDREN
        if tag in HEADING_LEVEL:
            writer.flush_paragraph()
            self.in_heading += 1
            return partial(self._close_heading, HEADING_LEVEL[tag])
        if tag == "dt":
            writer.flush_paragraph()
            return self._close_term
        if tag == "br":
            writer.text("\n")
            return SKIP_CHILDREN
        if tag == "img":
            alt = " ".join((node.attributes.get("alt") or "").split())
            if alt and _alt_is_text(node, alt):
                writer.text(f" {alt} ")
            return SKIP_CHILDREN
        if tag == "code" or tag in ("kbd", "samp", "tt"):
            self._inline_code(node)
            return SKIP_CHILDREN
        if tag == "math":
            self._math(node)
            return SKIP_CHILDREN
        if tag == "pre":
            writer.flush_paragraph()
            self._fenced_code(node)
            return SKIP_CHILDREN
        if tag == "hr":
            writer.flush_paragraph()
            if not self.plain:
                writer.block("---")
            return SKIP_CHILDREN
        if tag == "table" and not is_layout_table(node):
            writer.flush_paragraph()
            self._table(node)
            return SKIP_CHILDREN
        if tag in ("ul", "ol", "menu", "dir"):
            return self._open_list(node, ordered=tag == "ol")
        if tag == "li":
            return self._open_item()
        if tag == "blockquote":
            writer.flush_paragraph()
            quote = "  " if self.plain else "> "
            writer.containers.append(Container(quote, quote))
            return self._close_container
        if tag in BLOCK_TAGS:
            writer.flush_paragraph()
            return writer.flush_paragraph
        return None

    def _close_heading(self, level: int) -> None:
        writer = self.writer
        self.in_heading -= 1
        text = writer.inline_text()
        if text and self.pending_title and _repeats_title(text, self.pending_title):
            self.pending_title = ""
            return
        if text:
            self.pending_title = ""
            writer.heading(text if self.plain else f"{'#' * level} {text}", level)

    def _close_term(self) -> None:
        """A definition list's term, on a line of its own above its definitions."""
        text = self.writer.inline_text()
        if text:
            self.writer.block(text if self.plain else f"**{text}**")

    def _close_link(self, start: int, href: str) -> None:
        inline = self.writer.inline
        words = "".join(inline[start:])
        text = " ".join(words.split())
        if not text:
            return
        links = self.links
        url = links.resolve(href)
        if url is None:
            return
        if href.lstrip()[:1] == "#" or (links.document and url.startswith(links.document + "#")):
            # In-page links: a heading's permalink (¶, #, 🔗) goes; a citation mark ([12]) and
            # a heading linking to itself keep their words; a backlink (^, ↑) goes.
            if not any(char.isalnum() for char in text):
                del inline[start:]
                return
            if self.in_heading or CITATION_MARK.match(text):
                return

        if len(links.links) < links.max_links:
            links.record(text, url)
        if self.bare_links:
            return
        del inline[start:]
        lead = " " if words[:1].isspace() else ""
        trail = " " if words[-1:].isspace() else ""
        label = text.replace("[", "\\[").replace("]", "\\]") if "[" in text or "]" in text else text
        if self.references is not None:
            inline.append(f"{lead}[{label}][{self.references.number(url)}]{trail}")
        else:
            inline.append(f"{lead}[{label}]({_escape_url(url)}){trail}")

    def _inline_code(self, node: LexborNode) -> None:
        code = " ".join(node.text(deep=True).split())
        if not code:
            return
        if self.plain:
            self.writer.text(code)
            return
        fence = "``" if "`" in code else "`"
        pad = " " if code.startswith("`") or code.endswith("`") else ""
        self.writer.text(f"{fence}{pad}{code}{pad}{fence}")

    def _math(self, node: LexborNode) -> None:
        """MathML as its tokens in reading order: on a maths page the formulas are the text."""
        # Annotations restate the formula in another notation (TeX, content MathML): one copy.
        tokens = [
            token
            for leaf in node.css(MATH_TOKENS)
            if not _inside_annotation(leaf, node)
            for token in leaf.text(deep=True).split()
        ]
        if not tokens:
            return
        formula = " ".join(tokens)
        if (node.attributes.get("display") or "").lower() == "block":
            self.writer.flush_paragraph()
            self.writer.block(formula)
        else:
            self.writer.text(f" {formula} ")

    def _fenced_code(self, node: LexborNode) -> None:
        code = node.text(deep=True).strip("\n")
        if not code.strip():
            return
        if self.plain:
            self.writer.block(code, verbatim=True)
            return
        language = code_language(node)
        longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
        fence = "`" * max(3, longest + 1)
        self.writer.block(f"{fence}{language}\n{code}\n{fence}", verbatim=True)

    def _table(self, table: LexborNode) -> None:
        # Only called for a data table, which holds no other table: every row is its own.
        rows = [[self._cell_text(cell) for cell in row_cells(row)] for row in table.css("tr")]
        rows = [row for row in rows if any(row)]
        if not rows:
            return
        width = max(len(row) for row in rows)
        padded = [row + [""] * (width - len(row)) for row in rows]
        if self.plain:
            self.writer.block("\n".join("\t".join(row).rstrip() for row in padded))
            return
        lines = [table_row(padded[0]), table_row(["---"] * width)]
        lines.extend(table_row(row) for row in padded[1:])
        self.writer.block("\n".join(lines))

    def _cell_text(self, cell: LexborNode) -> str:
        # Only text inside, no element (most cells of big tables): no renderer of its own is needed.
        text_only = next(cell.iter(), None) is None
        text = " ".join(cell.text(deep=True).split()) if text_only else self._rendered_cell_text(cell)
        if self.plain or ("|" not in text and "\\" not in text):
            return text
        return text.replace("\\", "\\\\").replace("|", "\\|")

    def _rendered_cell_text(self, cell: LexborNode) -> str:
        cell_writer = MarkdownWriter(self.writer.max_chars)
        try:
            MarkdownRenderer(cell_writer, self.links, options=self.options, references=self.references).render(cell)
            cell_writer.flush_paragraph()
        except OutputFull:
            pass
        return " ".join(cell_writer.markdown().split())

    def _open_list(self, node: LexborNode, *, ordered: bool) -> ExitAction:
        writer = self.writer
        writer.flush_paragraph()
        start = node.attributes.get("start") if ordered else None
        first = int(start) if start and start.strip().isdigit() else 1
        writer.lists.append(ListState(ordered=ordered, next_number=first))

        def close() -> None:
            writer.flush_paragraph()
            writer.lists.pop()

        return close

    def _open_item(self) -> ExitAction:
        writer = self.writer
        writer.flush_paragraph()
        state = writer.lists[-1] if writer.lists else ListState(ordered=False, next_number=1)
        if state.ordered:
            marker = f"{state.next_number}. "
            state.next_number += 1
        else:
            marker = "• " if self.plain else "- "
        writer.containers.append(Container(marker, " " * len(marker)))
        return self._close_container

    def _close_container(self) -> None:
        self.writer.flush_paragraph()
        self.writer.containers.pop()


def _repeats_title(heading: str, title: str) -> bool:
    """Whether a heading says what the title line says: the same words, or the title less the
    site's name ("Budget approved | The Daily" for "Budget approved")."""
    if heading == title:
        return True
    return len(heading) >= TITLE_MATCH_MIN_CHARS and heading.casefold() in title.casefold()


def _alt_is_text(image: LexborNode, alt: str) -> bool:
    """Whether an image's alt text reads as part of the text: a short label or a formula.

    A linked image (a gallery thumbnail, a teaser card) or a figure (its caption speaks for it)
    adds a description of the picture, not words of the page; so does a long alt text. A
    formula drawn as an image (MediaWiki's `{\\displaystyle ...}`) is the text of a maths page.
    """
    if ALT_FORMULA.search(alt):
        return True
    if len(alt) > ALT_LABEL_CHARS:
        return False
    parent = image.parent
    for _ in range(ALT_CONTEXT_LEVELS):
        if parent is None:
            return True
        if parent.tag in ("a", "figure"):
            return False
        parent = parent.parent
    return True


def _inside_annotation(leaf: LexborNode, math: LexborNode) -> bool:
    parent = leaf.parent
    while parent is not None and parent.mem_id != math.mem_id:
        if parent.tag in ("annotation", "annotation-xml"):
            return True
        parent = parent.parent
    return False


def _escape_url(url: str) -> str:
    """Keep a URL from ending the markdown link early."""
    if " " not in url and "(" not in url and ")" not in url:
        return url
    return url.replace(" ", "%20").replace("(", "%28").replace(")", "%29")


def code_language(pre: LexborNode) -> str:
    """The language named by `language-x`/`lang-x` on the <pre> or its <code>."""
    candidates = [pre, *pre.css("code")[:1]]
    for node in candidates:
        match = CODE_LANGUAGE.search(node.attributes.get("class") or "")
        if match:
            return match.group(1).lower()
    return ""
