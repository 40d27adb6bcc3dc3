"""Response bytes to text for web_fetch, or a refusal when the body is not text.

Owns media-type classification, binary detection (the header AND the first bytes: a PDF labelled
text/html is still a PDF) and charset selection in the order header charset, BOM, `<meta>`
within the first 4 KiB, then detection. It is pure: bytes and a header value in, `DecodedBody`
or `GatewayError(unsupported_content)` out. It never touches the network, never raises anything
else, and never fails on undecodable bytes (they become U+FFFD).
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

import charset_normalizer
import orjson

from gateway.errors import ErrorCode, GatewayError

BodyKind = Literal["html", "markdown", "text", "json", "xml", "csv"]

META_SCAN_BYTES = 4096
SNIFF_BYTES = 4096
# charset-normalizer is slow on large inputs; a prefix is enough to tell the encoding.
DETECT_BYTES = 64 * 1024
# More control characters than this share of the sniffed prefix means a binary format.
MAX_CONTROL_RATIO = 0.02

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
MARKDOWN_TYPES = frozenset({"text/markdown", "text/x-markdown"})
CSV_TYPES = frozenset({"text/csv", "application/csv", "text/comma-separated-values"})
JSON_TYPES = frozenset({"application/json", "text/json", "application/x-ndjson"})
XML_TYPES = frozenset({"application/xml", "text/xml"})
TEXT_APPLICATION_TYPES = frozenset(
    {
        "application/javascript", "application/x-javascript", "application/ecmascript",
        "application/x-sh", "application/x-yaml", "application/yaml", "application/toml",
        "application/sql", "application/graphql", "application/x-httpd-php",
    }
)  # fmt: skip
BINARY_PREFIXES = ("image/", "audio/", "video/", "font/", "model/")
BINARY_TYPES = frozenset(
    {
        "application/pdf", "application/octet-stream", "application/zip", "application/gzip",
        "application/x-gzip", "application/x-tar", "application/x-7z-compressed",
        "application/x-rar-compressed", "application/vnd.rar", "application/x-bzip2",
        "application/x-xz", "application/zstd", "application/wasm", "application/java-archive",
        "application/x-executable", "application/x-msdownload", "application/msword",
        "application/vnd.ms-excel", "application/vnd.ms-powerpoint", "application/x-shockwave-flash",
        "application/ogg", "application/x-protobuf", "application/vnd.sqlite3",
    }
)  # fmt: skip
BINARY_SUBTYPE = re.compile(r"^application/vnd\.(openxmlformats|oasis|ms-|android|apple)")

# (offset, signature, format name): formats agents cannot read as text.
MAGIC_NUMBERS: tuple[tuple[int, bytes, str], ...] = (
    (0, b"%PDF-", "PDF"),
    (0, b"\x89PNG\r\n\x1a\n", "PNG image"),
    (0, b"GIF87a", "GIF image"),
    (0, b"GIF89a", "GIF image"),
    (0, b"\xff\xd8\xff", "JPEG image"),
    (0, b"II*\x00", "TIFF image"),
    (0, b"MM\x00*", "TIFF image"),
    (0, b"PK\x03\x04", "ZIP archive"),
    (0, b"PK\x05\x06", "ZIP archive"),
    (0, b"PK\x07\x08", "ZIP archive"),
    (0, b"\x1f\x8b", "gzip archive"),
    (0, b"7z\xbc\xaf\x27\x1c", "7z archive"),
    (0, b"Rar!\x1a\x07", "RAR archive"),
    (0, b"\xfd7zXZ\x00", "xz archive"),
    (0, b"\x28\xb5\x2f\xfd", "zstd archive"),
    (0, b"RIFF", "RIFF media (WAV/AVI/WebP)"),
    (0, b"ID3", "MP3 audio"),
    (0, b"\xff\xfb", "MP3 audio"),
    (0, b"\xff\xf3", "MP3 audio"),
    (0, b"\xff\xf2", "MP3 audio"),
    (0, b"OggS", "Ogg media"),
    (0, b"fLaC", "FLAC audio"),
    (0, b"\x1aE\xdf\xa3", "Matroska/WebM video"),
    (4, b"ftyp", "MP4/QuickTime media"),
    (0, b"\x00asm", "WebAssembly module"),
    (0, b"\x7fELF", "ELF executable"),
    (0, b"\xca\xfe\xba\xbe", "Mach-O or Java class"),
    (0, b"\xcf\xfa\xed\xfe", "Mach-O executable"),
    (0, b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "OLE document (doc/xls)"),
    (0, b"SQLite format 3\x00", "SQLite database"),
    (0, b"wOFF", "WOFF font"),
    (0, b"wOF2", "WOFF2 font"),
    (257, b"ustar", "tar archive"),
)
BOMS: tuple[tuple[bytes, str], ...] = (
    (b"\xef\xbb\xbf", "utf-8"),
    (b"\xff\xfe\x00\x00", "utf-32-le"),
    (b"\x00\x00\xfe\xff", "utf-32-be"),
    (b"\xff\xfe", "utf-16-le"),
    (b"\xfe\xff", "utf-16-be"),
)
META_CHARSET = re.compile(rb"<meta[^>]{0,512}?charset\s*=\s*[\"']?\s*([A-Za-z0-9_:.\-]+)", re.I)
XML_ENCODING = re.compile(rb"^<\?xml[^>]{0,200}?encoding\s*=\s*[\"']([A-Za-z0-9_.\-]+)", re.I)
# WHATWG Encoding: labels browsers read as a wider Windows code page, because servers mislabel.
WHATWG_SUPERSETS = MappingProxyType({
    "iso-8859-1": "cp1252", "iso8859-1": "cp1252", "latin1": "cp1252", "latin-1": "cp1252",
    "l1": "cp1252", "us-ascii": "cp1252", "ascii": "cp1252", "ansi_x3.4-1968": "cp1252",
    "iso-8859-9": "cp1254", "latin5": "cp1254", "iso-8859-11": "cp874", "tis-620": "cp874",
    "shift_jis": "cp932", "shift-jis": "cp932", "sjis": "cp932", "x-sjis": "cp932",
    "ms_kanji": "cp932", "windows-31j": "cp932", "euc-kr": "cp949", "ks_c_5601-1987": "cp949",
    "gb2312": "gb18030", "gbk": "gb18030", "x-gbk": "gb18030",
})  # fmt: skip
LONG_NUMBER = re.compile(r"\d{19,}")
CONTROL_BYTES = frozenset(range(0x20)) - {0x09, 0x0A, 0x0C, 0x0D, 0x1B}


@dataclass(frozen=True, slots=True)
class DecodedBody:
    kind: BodyKind
    text: str
    content_type: str  # the media type, lowercased, no parameters


def decode_body(body: bytes, content_type_header: str | None) -> DecodedBody:
    """Classify and decode a response body; refuse binary content with unsupported_content."""
    media_type, header_charset = parse_content_type(content_type_header)
    refuse_binary_media_type(media_type)
    bom = bom_encoding(body)
    refuse_binary_bytes(body, utf16_or_32=bool(bom and bom.startswith("utf-") and bom != "utf-8"))
    kind = kind_for(media_type, body)
    text = decode_text(body, header_charset, bom, scan_markup=kind in ("html", "xml"))
    if kind == "json":
        pretty = pretty_json(text)
        if pretty is None:
            return DecodedBody("text", text, media_type or "application/json")
        text = pretty
    return DecodedBody(kind, text, media_type or sniffed_media_type(kind))


def parse_content_type(header: str | None) -> tuple[str, str | None]:
    """(media type lowercased, charset parameter or None); "" when the header is absent."""
    if not header:
        return "", None
    media_type, _, params = header.partition(";")
    charset = None
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip("\"'").strip() or None
    return media_type.strip().lower(), charset


def refuse_binary_media_type(media_type: str) -> None:
    if media_type.startswith(BINARY_PREFIXES) or media_type in BINARY_TYPES or BINARY_SUBTYPE.match(media_type):
        raise GatewayError(ErrorCode.UNSUPPORTED_CONTENT, f"binary content type {media_type}")


def refuse_binary_bytes(body: bytes, *, utf16_or_32: bool) -> None:
    """Refuse a body whose first bytes are a binary format, whatever its label says."""
    for offset, signature, name in MAGIC_NUMBERS:
        if body[offset : offset + len(signature)] == signature:
            raise GatewayError(ErrorCode.UNSUPPORTED_CONTENT, f"body is binary ({name})")
    if utf16_or_32:
        return  # UTF-16/32 text is full of NUL bytes by design.
    head = body[:SNIFF_BYTES]
    if b"\x00" in head:
        raise GatewayError(ErrorCode.UNSUPPORTED_CONTENT, "body is binary (NUL bytes)")
    controls = sum(1 for byte in head if byte in CONTROL_BYTES)
    if head and controls / len(head) > MAX_CONTROL_RATIO:
        raise GatewayError(ErrorCode.UNSUPPORTED_CONTENT, "body is binary (control bytes)")


def kind_for(media_type: str, body: bytes) -> BodyKind:
    """The text kind for a media type; unknown or missing types are sniffed from the body."""
    if media_type in HTML_TYPES:
        return "html"
    if media_type in MARKDOWN_TYPES:
        return "markdown"
    if media_type in CSV_TYPES:
        return "csv"
    if media_type in JSON_TYPES or media_type.endswith("+json"):
        return "json"
    if media_type in XML_TYPES or media_type.endswith("+xml"):
        return "xml"
    if media_type.startswith("text/") or media_type in TEXT_APPLICATION_TYPES:
        return "text"
    return sniff_kind(body)


def sniff_kind(body: bytes) -> BodyKind:
    """Guess from the first bytes (the body is already known not to be binary)."""
    head = body[:1024].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith((b"<!doctype html", b"<html")) or b"<head" in head or b"<body" in head:
        return "html"
    if head.startswith(b"<?xml"):
        return "html" if b"<html" in head else "xml"
    if head.startswith((b"{", b"[")):
        return "json"
    return "text"


def sniffed_media_type(kind: BodyKind) -> str:
    return {
        "html": "text/html",
        "markdown": "text/markdown",
        "text": "text/plain",
        "json": "application/json",
        "xml": "application/xml",
        "csv": "text/csv",
    }[kind]


def bom_encoding(body: bytes) -> str | None:
    for bom, encoding in BOMS:
        if body.startswith(bom):
            return encoding
    return None


def codec_for(label: str | None) -> str | None:
    """A Python codec for a charset label, applying the WHATWG supersets; None if unknown."""
    if not label:
        return None
    name = label.strip().lower()
    name = WHATWG_SUPERSETS.get(name, name)
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def decode_text(body: bytes, header_charset: str | None, bom: str | None, *, scan_markup: bool) -> str:
    """Decode with the first charset that names a known codec, never failing on bad bytes.

    A BOM outranks the header, as in browsers (WHATWG "decode"): it cannot be there by accident.
    """
    if bom is not None:
        return body.decode(bom, errors="replace").removeprefix("\ufeff")
    encoding = codec_for(header_charset)
    if encoding is None and scan_markup:
        encoding = declared_in_markup(body[:META_SCAN_BYTES])
        # Pages re-saved as UTF-8 often keep their old `<meta charset=gb2312>`. Non-ASCII bytes
        # that are valid UTF-8 are almost never a legacy encoding, so the bytes win over the tag.
        if encoding is not None and encoding != "utf-8" and _is_non_ascii_utf8(body):
            encoding = "utf-8"
    if encoding is None:
        encoding = detected_encoding(body)
    try:
        return body.decode(encoding, errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")


def _is_non_ascii_utf8(body: bytes) -> bool:
    if body.isascii():
        return False
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def declared_in_markup(head: bytes) -> str | None:
    match = XML_ENCODING.match(head) or META_CHARSET.search(head)
    if match is None:
        return None
    encoding = codec_for(match.group(1).decode("ascii", errors="replace"))
    # A page that really were UTF-16 could not declare it in ASCII: HTML says use UTF-8.
    if encoding is not None and encoding.startswith(("utf-16", "utf-32")):
        return "utf-8"
    return encoding


def detected_encoding(body: bytes) -> str:
    """UTF-8 when the bytes are valid UTF-8 (the web's default), else charset-normalizer."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        return "utf-8"
    best = charset_normalizer.from_bytes(body[:DETECT_BYTES]).best()
    if best is None:
        return "cp1252"
    return codec_for(best.encoding) or "utf-8"


def pretty_json(text: str) -> str | None:
    """Two-space indented JSON, or None when the text is not JSON."""
    if LONG_NUMBER.search(text) is None:
        try:
            return orjson.dumps(orjson.loads(text), option=orjson.OPT_INDENT_2).decode("utf-8")
        except orjson.JSONDecodeError:
            return None
    # orjson reads integers beyond 64 bits as floats and loses digits: ids and hashes must
    # survive, so such documents take the standard library's exact path.
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return None
