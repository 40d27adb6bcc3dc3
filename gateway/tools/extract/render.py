"""A response body as page text: the pure function the extraction workers (and small pages) run.

Owns the routing of a body to its converter: PDF (by media type or `%PDF-` magic) to `pdf`,
otherwise decoding, bot-challenge detection and HTML → markdown. Refusals come back as values
(a GatewayError held, not raised), and cross the worker boundary as its plain JSON wire form. Never
touches the network, never reads files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.extract.render_options import DEFAULT_RENDER_OPTIONS, RenderOptions

PDF_TYPES = frozenset({"application/pdf", "application/x-pdf"})
PDF_MAGIC = b"%PDF-"


@dataclass(frozen=True, slots=True)
class RenderLimits:
    """What one conversion may produce and spend (the fetch policy's caps)."""

    max_chars: int
    convert_html: bool = True
    options: RenderOptions = DEFAULT_RENDER_OPTIONS
    max_pdf_pages: int = 200
    # Past this the PDF keeps the pages read so far (sourceTruncated); the pool's hard limit,
    # which replaces the worker, is a little later.
    pdf_time_s: float = 10.0

    def to_wire(self) -> dict[str, Any]:
        return {
            "max_chars": self.max_chars,
            "convert_html": self.convert_html,
            "options": {"format": self.options.format, "links": self.options.links},
            "max_pdf_pages": self.max_pdf_pages,
            "pdf_time_s": self.pdf_time_s,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> RenderLimits:
        options = data["options"]
        return cls(
            max_chars=int(data["max_chars"]),
            convert_html=bool(data["convert_html"]),
            options=RenderOptions(options["format"], options["links"]),
            max_pdf_pages=int(data["max_pdf_pages"]),
            pdf_time_s=float(data["pdf_time_s"]),
        )


@dataclass(frozen=True, slots=True)
class RenderedPage:
    """A body as page text, or the GatewayError that refuses it."""

    text: str = ""
    title: str = ""
    content_type: str = ""
    links: tuple[tuple[str, str], ...] = ()  # (text, url)
    source_truncated: bool = False
    challenge: str | None = None
    refusal: GatewayError | None = None

    def raise_refusal(self) -> None:
        if self.refusal is not None:
            raise self.refusal

    def to_wire(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "title": self.title,
            "content_type": self.content_type,
            "links": self.links,
            "source_truncated": self.source_truncated,
            "challenge": self.challenge,
            "refusal": self.refusal.to_wire() if self.refusal is not None else None,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> RenderedPage:
        """Rebuild from a worker's answer; a malformed one is a refusal, not an exception."""
        try:
            refusal = data["refusal"]
            return cls(
                text=str(data["text"]),
                title=str(data["title"]),
                content_type=str(data["content_type"]),
                links=tuple((str(text), str(url)) for text, url in data["links"]),
                source_truncated=bool(data["source_truncated"]),
                challenge=None if data["challenge"] is None else str(data["challenge"]),
                refusal=None if refusal is None else GatewayError.from_wire(refusal),
            )
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            return cls(refusal=GatewayError(ErrorCode.UNSUPPORTED_CONTENT, "the converter returned a malformed answer"))


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def is_pdf(body: bytes, content_type: str | None) -> bool:
    return media_type(content_type) in PDF_TYPES or body.startswith(PDF_MAGIC)


def render_page(
    body: bytes,
    content_type: str | None,
    status: int,
    headers: Mapping[str, str],
    base_url: str,
    *,
    limits: RenderLimits,
) -> RenderedPage:
    """Decode, look for a bot challenge, and convert to page text (pure)."""
    # Imported here: a process that never converts a page never loads the parsers.
    from gateway.tools.extract.challenge import detect_challenge  # noqa: PLC0415
    from gateway.tools.extract.decode import decode_body  # noqa: PLC0415
    from gateway.tools.extract.markdown import html_to_markdown  # noqa: PLC0415
    from gateway.tools.extract.structure_guard import check_structure  # noqa: PLC0415

    try:
        if status < 400 and limits.convert_html and is_pdf(body, content_type):
            from gateway.tools.extract.pdf import pdf_to_text  # noqa: PLC0415

            document = pdf_to_text(body, max_pages=limits.max_pdf_pages, max_chars=limits.max_chars,
                                   time_budget_s=limits.pdf_time_s)  # fmt: skip
            return RenderedPage(document.text, document.title, "application/pdf", (), document.truncated)
        try:
            decoded = decode_body(body, content_type)
        except GatewayError:
            if status < 400:
                raise
            # An error page we cannot read is still an error status, not a content problem.
            decoded = decode_body(b"", "text/plain")
        challenge = detect_challenge(status, headers, decoded.text if decoded.kind == "html" else "")
        if challenge is not None:
            return RenderedPage(challenge=challenge)
        if decoded.kind == "html" and limits.convert_html:
            # Before any parser: nesting and attribute bombs make parsing quadratic.
            check_structure(decoded.text)
            extraction = html_to_markdown(decoded.text, base_url, max_chars=limits.max_chars, options=limits.options)
            return RenderedPage(
                extraction.markdown,
                extraction.title,
                decoded.content_type,
                tuple((link.text, link.url) for link in extraction.links),
                extraction.source_truncated,
            )
        text = decoded.text
        max_chars = limits.max_chars
        return RenderedPage(text[:max_chars], "", decoded.content_type, (), len(text) > max_chars)
    except GatewayError as exc:
        return RenderedPage(refusal=exc)
