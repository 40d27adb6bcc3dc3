"""How web_fetch writes a page's main content: the `format` and `links` choices of the caller.

Owns the two option vocabularies and their defaults, shared by the fetch argument parser, the
extraction pool and the renderers, so that each names the same values. Values only; it never
renders or parses anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

# markdown: headings, lists, links, tables as markdown; text: the same blocks with no markup;
# html: the cleaned main content as HTML (attributes cut to a safe few, links absolute).
OutputFormat = Literal["markdown", "text", "html"]
# inline: [words](url); references: [words][n] with the URLs in a numbered list at the end;
# none: only the words (the result's `links` list still names the URLs).
LinkStyle = Literal["inline", "references", "none"]
OUTPUT_FORMATS: tuple[str, ...] = get_args(OutputFormat)
LINK_STYLES: tuple[str, ...] = get_args(LinkStyle)


@dataclass(frozen=True, slots=True)
class RenderOptions:
    format: OutputFormat = "markdown"
    links: LinkStyle = "inline"


DEFAULT_RENDER_OPTIONS = RenderOptions()
