"""web_fetch of PDFs end to end: documents written by the test, served by a loopback origin.

Text with page markers and the metadata title, the page cap, the PDF wire cap beside the HTML
one, a PDF recognised by its magic under another media type, and each refusal: encrypted,
image-only, broken, and bombs of nested objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.harness import pdfs
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import Origin, OriginFactory

MANY_PAGES = 230
PAGE_CAP = 200
PDF_CAP_BYTES = 4 * 1024 * 1024
# Over the 2 MiB HTML wire cap, under the PDF cap of this test's policy.
LARGE_PDF_LINES = 150
LARGE_PDF_PAGES = 85


def _lines(page: int, count: int = 3) -> list[str]:
    return [f"Page {page} line {line}: the quick brown fox reads a document." for line in range(count)]


DOCUMENTS: dict[str, tuple[bytes, str]] = {}


def documents() -> dict[str, tuple[bytes, str]]:
    if not DOCUMENTS:
        long_line = "Long line of a large report, padded so the file is big. " * 4
        DOCUMENTS.update(
            {
                "/report.pdf": (
                    pdfs.text_pdf([_lines(1), _lines(2), _lines(3)], title="Quarterly Report"),
                    "application/pdf",
                ),
                "/many.pdf": (pdfs.text_pdf([_lines(n, 1) for n in range(1, MANY_PAGES + 1)]), "application/pdf"),
                "/download": (
                    pdfs.text_pdf([["Served as a download, read by its magic."]]),
                    "application/octet-stream",
                ),
                "/large.pdf": (
                    pdfs.text_pdf([[long_line] * LARGE_PDF_LINES for _ in range(LARGE_PDF_PAGES)]),
                    "application/pdf",
                ),
                "/encrypted.pdf": (pdfs.encrypted_pdf(), "application/pdf"),
                "/scan.pdf": (pdfs.image_only_pdf(), "application/pdf"),
                "/broken.pdf": (pdfs.broken_pdf(), "application/pdf"),
                "/nested-bomb.pdf": (pdfs.nested_array_bomb_pdf(), "application/pdf"),
                "/tree-bomb.pdf": (pdfs.page_tree_bomb_pdf(), "application/pdf"),
                "/self-tree.pdf": (pdfs.self_referencing_tree_pdf(), "application/pdf"),
                "/flate-bomb.pdf": (pdfs.flate_bomb_pdf(), "application/pdf"),
            }
        )
    return DOCUMENTS


def pdf_app() -> web.Application:
    async def serve(request: web.Request) -> web.Response:
        body, content_type = documents()[request.path]
        return web.Response(body=body, content_type=content_type)

    app = web.Application()
    for path in documents():
        app.router.add_get(path, serve)
    return app


@dataclass
class PdfStack:
    origin: Origin
    gateway: GatewayProcess

    def fetch(self, path: str, **fields: Any) -> httpx.Response:
        payload = {"url": self.origin.url(path, "papers.example.org"), **fields}
        return httpx.post(f"{self.gateway.api_url}/v1/fetch", json=payload, timeout=30)

    def ok(self, path: str, **fields: Any) -> dict[str, Any]:
        response = self.fetch(path, **fields)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def refused(self, path: str) -> dict[str, Any]:
        response = self.fetch(path)
        assert response.status_code != 200, response.text
        error: dict[str, Any] = response.json()["error"]
        return error


@pytest.fixture(scope="module")
def pdf_stack(
    harness_loop: Any, pki: TestPKI, fake_dns: FakeDNS, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PdfStack]:
    factory = OriginFactory(harness_loop, pki, fake_dns)
    origin = factory.start(pdf_app(), names=["papers.example.org"])
    policy = policy_document(
        allow_cidrs=[origin.cidr],
        ports=[80, 443, origin.port],
        fetch={"robots": "ignore", "max_pdf_bytes": PDF_CAP_BYTES, "max_pdf_pages": PAGE_CAP},
    )
    workdir = tmp_path_factory.mktemp("pdf-gateway")
    gateway = GatewayProcess(workdir, policy, nameserver=fake_dns.nameserver, ca_bundle=pki.ca_path).start()
    yield PdfStack(origin, gateway)
    gateway.stop()
    factory.stop_all()


def test_pdf_becomes_text_with_page_markers_and_its_metadata_title(pdf_stack: PdfStack) -> None:
    result = pdf_stack.ok("/report.pdf")
    assert result["contentType"] == "application/pdf"
    assert result["title"] == "Quarterly Report"
    content = result["content"]
    markers = [content.index(f"[page {n}/3]") for n in (1, 2, 3)]
    assert markers == sorted(markers)
    assert "Page 2 line 1: the quick brown fox reads a document." in content
    assert content.index("Page 2 line 0") > markers[1]
    assert result["sourceTruncated"] is False


def test_pages_past_the_page_cap_are_left_out_and_the_source_marked_truncated(pdf_stack: PdfStack) -> None:
    result = pdf_stack.ok("/many.pdf", maxChars=32_000)
    text = result["content"]
    offset = result["nextOffset"]
    while offset is not None:
        more = pdf_stack.ok("/many.pdf", maxChars=32_000, offset=offset, expectedHash=result["contentHash"])
        text += more["content"]
        offset = more["nextOffset"]
    assert f"[page {PAGE_CAP}/{MANY_PAGES}]" in text
    assert f"[page {PAGE_CAP + 1}/{MANY_PAGES}]" not in text
    assert f"Page {PAGE_CAP + 1} line" not in text
    assert result["sourceTruncated"] is True


def test_a_pdf_served_under_another_media_type_is_read_by_its_magic(pdf_stack: PdfStack) -> None:
    result = pdf_stack.ok("/download")
    assert result["contentType"] == "application/pdf"
    assert "Served as a download, read by its magic." in result["content"]


def test_the_pdf_wire_cap_admits_a_pdf_larger_than_the_html_cap(pdf_stack: PdfStack) -> None:
    size = len(documents()["/large.pdf"][0])
    assert 2 * 1024 * 1024 < size < PDF_CAP_BYTES
    result = pdf_stack.ok("/large.pdf")
    assert f"[page 1/{LARGE_PDF_PAGES}]" in result["content"]
    assert result["sourceTruncated"] is True  # 400,000 characters of text are more than the cap


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/encrypted.pdf", "encrypted PDF"),
        ("/scan.pdf", "image-only PDF"),
        ("/broken.pdf", "PDF could not be read"),
        ("/nested-bomb.pdf", "image-only PDF"),
        ("/tree-bomb.pdf", "PDF could not be read"),
        ("/self-tree.pdf", "self-referencing page tree"),
    ],
    ids=["encrypted", "image-only", "broken", "nested-array-bomb", "page-tree-bomb", "self-referencing-tree"],
)
def test_unreadable_pdfs_are_unsupported_content_saying_why(pdf_stack: PdfStack, path: str, reason: str) -> None:
    error = pdf_stack.refused(path)
    assert error["code"] == "unsupported_content"
    assert reason in error["message"]


def test_a_self_referencing_page_tree_leaves_no_traceback_and_the_worker_serves_on(pdf_stack: PdfStack) -> None:
    assert pdf_stack.refused("/self-tree.pdf")["code"] == "unsupported_content"
    assert "Traceback" not in pdf_stack.gateway.stderr()
    assert "[page 1/3]" in pdf_stack.ok("/report.pdf")["content"]


@pytest.mark.serial  # seconds of CPU inflating the bomb, within a 30 s answer: needs the machine to itself
def test_a_pdf_that_inflates_past_the_converters_memory_is_too_large(pdf_stack: PdfStack) -> None:
    error = pdf_stack.refused("/flate-bomb.pdf")
    assert error["code"] == "too_large", error
    assert "more memory" in error["message"], error
    assert "Traceback" not in pdf_stack.gateway.stderr()
    assert "[page 1/3]" in pdf_stack.ok("/report.pdf")["content"]


def test_a_pdf_over_the_pdf_cap_is_too_large(
    harness_loop: Any, pki: TestPKI, fake_dns: FakeDNS, tmp_path_factory: pytest.TempPathFactory
) -> None:
    factory = OriginFactory(harness_loop, pki, fake_dns)
    origin = factory.start(pdf_app(), names=["capped.example.org"])
    policy = policy_document(
        allow_cidrs=[origin.cidr], ports=[80, 443, origin.port], fetch={"robots": "ignore", "max_pdf_bytes": 64 * 1024}
    )
    workdir = tmp_path_factory.mktemp("pdf-cap-gateway")
    gateway = GatewayProcess(workdir, policy, nameserver=fake_dns.nameserver, ca_bundle=pki.ca_path).start()
    try:
        url = origin.url("/large.pdf", "capped.example.org")
        response = httpx.post(f"{gateway.api_url}/v1/fetch", json={"url": url}, timeout=30)
        assert response.status_code == 502, response.text
        assert response.json()["error"]["code"] == "too_large"
        small = httpx.post(
            f"{gateway.api_url}/v1/fetch", json={"url": origin.url("/report.pdf", "capped.example.org")}, timeout=30
        )
        assert small.status_code == 200, small.text
    finally:
        gateway.stop()
        factory.stop_all()
