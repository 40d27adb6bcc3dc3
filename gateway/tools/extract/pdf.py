"""PDF → plain text with page markers, for web_fetch; runs only in an extraction worker.

Owns the PDF rules: text page by page through PDFium (pypdfium2), each page headed by
`[page N/TOTAL]`, the title from the document's metadata, and the caps: pages, characters and a
time budget, each of which stops the reading and marks the text source-truncated. Encrypted and
image-only documents are refused with `unsupported_content` saying which. PDFium (the C++ engine
of Chromium's viewer) was chosen over pypdf: 3x faster on text pages and it refuses a
page-tree bomb at once where pypdf spends half a second before its own limit. It is pure (bytes
in, `PdfText` or `GatewayError` out) and never touches the network; the pool's hard time limit
and the worker's memory cap stand behind the caps here for a page PDFium itself gets lost in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pypdfium2 as pdfium

from gateway.errors import ErrorCode, GatewayError


@dataclass(frozen=True, slots=True)
class PdfText:
    title: str
    text: str
    pages: int
    truncated: bool


def _open(body: bytes) -> pdfium.PdfDocument:
    try:
        return pdfium.PdfDocument(body)
    except pdfium.PdfiumError as exc:
        if "password" in str(exc).lower():
            raise GatewayError(ErrorCode.UNSUPPORTED_CONTENT, "encrypted PDF: it needs a password to open") from None
        reason = str(exc).split("(PDFium: ", 1)[-1].rstrip(").") or "unreadable"
        raise GatewayError(ErrorCode.UNSUPPORTED_CONTENT, f"PDF could not be read ({reason})") from None


def _page_text(document: pdfium.PdfDocument, index: int) -> str:
    try:
        page = document[index]
    except pdfium.PdfiumError:
        # PDFium will not load a page whose tree is broken, e.g. a /Pages node among its own kids.
        raise GatewayError(
            ErrorCode.UNSUPPORTED_CONTENT,
            f"PDF page {index + 1} could not be loaded (a broken or self-referencing page tree)",
        ) from None
    try:
        textpage = page.get_textpage()
        try:
            return str(textpage.get_text_range())
        finally:
            textpage.close()
    finally:
        page.close()


def _title(document: pdfium.PdfDocument) -> str:
    try:
        raw = document.get_metadata_value("Title")
    except (pdfium.PdfiumError, KeyError, ValueError):
        return ""
    return " ".join(str(raw or "").split())


def pdf_to_text(body: bytes, *, max_pages: int, max_chars: int, time_budget_s: float) -> PdfText:
    """The document's text, `[page N/TOTAL]` before each page, within the caps."""
    # CPU time of this (worker) process, as the pool's hard limit counts it.
    deadline = time.process_time() + time_budget_s
    document = _open(body)
    try:
        total = len(document)
        if total == 0:
            raise GatewayError(ErrorCode.UNSUPPORTED_CONTENT, "PDF has no pages")
        title = _title(document)
        parts: list[str] = [f"# {title}\n"] if title else []
        size = len(parts[0]) if parts else 0
        read = 0
        found_text = False
        truncated = total > max_pages
        for index in range(min(total, max_pages)):
            if read and time.process_time() > deadline:
                truncated = True
                break
            text = "\n".join(line.rstrip() for line in _page_text(document, index).replace("\r\n", "\n").split("\n"))
            read += 1
            found_text = found_text or bool(text.strip())
            part = f"[page {index + 1}/{total}]\n{text.strip()}\n"
            if size + len(part) > max_chars:
                parts.append(part[: max_chars - size])
                truncated = True
                break
            parts.append(part)
            size += len(part)
        if not found_text:
            raise GatewayError(
                ErrorCode.UNSUPPORTED_CONTENT,
                f"image-only PDF: no text layer on the {read} page(s) read (a scan needs OCR)",
            )
        return PdfText(title, "\n".join(parts), total, truncated)
    finally:
        document.close()
