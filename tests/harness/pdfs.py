"""Small PDFs written byte by byte for the web_fetch tests: text, pages, no text, broken, bombs.

Each builder returns the bytes of a complete file (header, objects, cross-reference table,
trailer) so the converter sees what a real producer writes; encryption goes through pypdf.
"""

from __future__ import annotations

import io


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def build_pdf(objects: list[bytes], *, info: bytes | None = None) -> bytes:
    """A PDF whose object 1 is the catalog; `objects[i]` is the body of object i + 1."""
    if info is not None:
        objects = [*objects, info]
    out = io.BytesIO()
    out.write(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    trailer = b"/Size %d /Root 1 0 R" % (len(objects) + 1)
    if info is not None:
        trailer += b" /Info %d 0 R" % len(objects)
    out.write(b"trailer\n<< " + trailer + b" >>\nstartxref\n%d\n%%%%EOF\n" % xref)
    return out.getvalue()


def text_pdf(pages: list[list[str]], *, title: str | None = None) -> bytes:
    """One page per entry, each line drawn in Helvetica; the document title in its Info."""
    count = len(pages)
    # Objects: 1 catalog, 2 page tree, 3 font, then a page and its content stream per page.
    page_numbers = [4 + 2 * index for index in range(count)]
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % n for n in page_numbers) + b"] /Count %d >>" % count,
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for index, lines in enumerate(pages):
        ops = ["BT /F1 12 Tf 72 720 Td 14 TL"] + [f"({_escape(line)}) Tj T*" for line in lines] + ["ET"]
        stream = "\n".join(ops).encode("latin-1")
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >>"
            b" /Contents %d 0 R >>" % (page_numbers[index] + 1)
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    info = b"<< /Title (" + _escape(title).encode("latin-1") + b") >>" if title is not None else None
    return build_pdf(objects, info=info)


def image_only_pdf(pages: int = 2) -> bytes:
    """Pages that only paint (a filled rectangle, as a scan's image would): no text layer."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids ["
        + b" ".join(b"%d 0 R" % (3 + 2 * i) for i in range(pages))
        + b"] /Count %d >>" % pages,
    ]
    stream = b"0.5 g 72 72 468 648 re f"
    for index in range(pages):
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R >>" % (4 + 2 * index))
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    return build_pdf(objects)


def nested_array_bomb_pdf(depth: int = 200_000) -> bytes:
    """A page whose resources hold an array nested `depth` deep: recursion in a naive parser."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /X " + b"[" * depth + b"]" * depth
        + b" >> /Contents 4 0 R >>",
        b"<< /Length 0 >>\nstream\n\nendstream",
    ]  # fmt: skip
    return build_pdf(objects)


def page_tree_bomb_pdf(fanout: int = 40, levels: int = 4) -> bytes:
    """A page tree that names the same page node `fanout ** levels` times: a billion pages declared."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    # Object 2 is the root; each level's node lists the next level's node `fanout` times.
    for level in range(levels):
        number = 2 + level
        child = number + 1
        kids = b" ".join([b"%d 0 R" % child] * fanout)
        objects.append(b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % fanout ** (levels - level))
    page = 2 + levels
    objects.append(b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Contents %d 0 R >>" % (page - 1, page + 1))
    stream = b"BT ET"
    objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    return build_pdf(objects)


def encrypted_pdf(password: str = "secret") -> bytes:
    """A text PDF that needs a user password to open."""
    from pypdf import PdfReader, PdfWriter  # noqa: PLC0415 - tests only

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(text_pdf([["Confidential text"]]))))
    writer.encrypt(user_password=password, owner_password=password + "-owner", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def broken_pdf() -> bytes:
    """The magic and a truncated object, then garbage: no cross-reference, no catalog."""
    return b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R\n" + bytes(range(256)) * 4


def self_referencing_tree_pdf() -> bytes:
    """A page tree whose root lists itself among its kids, beside one real page."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [2 0 R 3 0 R] /Count 2 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>",
    ]
    return build_pdf(objects)


def flate_bomb_pdf(inflated_bytes: int = 1_300_000_000) -> bytes:
    """One page whose content stream inflates from about a thousandth of its size to
    `inflated_bytes` of blanks after a line of text: more than the converter's address space.

    Built fast: a block deflated once after a full flush (which resets the window) deflates to the
    same bytes every time, so the stream is that piece repeated, with the checksum computed apart.
    """
    import zlib  # noqa: PLC0415 - tests only

    head = b"BT /F1 12 Tf 72 720 Td (Inflated) Tj ET\n"
    block = b" " * (16 * 1024 * 1024)
    count = inflated_bytes // len(block)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = compressor.compress(head) + compressor.flush(zlib.Z_FULL_FLUSH)
    piece = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    checksum = zlib.adler32(head)
    for _ in range(count):
        checksum = zlib.adler32(block, checksum)
    stream = b"\x78\xda" + first + piece * count + compressor.flush() + checksum.to_bytes(4, "big")
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >>"
        b" /Contents 4 0 R >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    return build_pdf(objects)
