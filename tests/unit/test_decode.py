"""Response bytes to text: kinds, charsets, and refusal of every binary format."""

from __future__ import annotations

import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.extract.decode import DecodedBody, decode_body


@pytest.mark.parametrize(
    ("body", "header", "kind", "media_type"),
    [
        pytest.param(b"<p>hi</p>", "text/html; charset=utf-8", "html", "text/html", id="html"),
        pytest.param(b"<html/>", "Application/XHTML+XML", "html", "application/xhtml+xml", id="xhtml"),
        pytest.param(b"# Title", "text/markdown", "markdown", "text/markdown", id="markdown"),
        pytest.param(b"hello", "text/plain", "text", "text/plain", id="plain"),
        pytest.param(b"a,b\n1,2", "text/csv", "csv", "text/csv", id="csv"),
        pytest.param(b"<a/>", "application/rss+xml", "xml", "application/rss+xml", id="rss-xml"),
        pytest.param(b"<a/>", "text/xml", "xml", "text/xml", id="text-xml"),
        pytest.param(b"<!DOCTYPE html><p>x", None, "html", "text/html", id="sniffed-html"),
        pytest.param(b"<?xml version='1.0'?><a/>", None, "xml", "application/xml", id="sniffed-xml"),
        pytest.param(b'{"a": 1}', None, "json", "application/json", id="sniffed-json"),
        pytest.param(b"just words", None, "text", "text/plain", id="sniffed-text"),
        pytest.param(b"just words", "application/x-unknown", "text", "application/x-unknown", id="unknown-type-text"),
    ],
)  # fmt: skip
def test_kind_and_media_type(body: bytes, header: str | None, kind: str, media_type: str) -> None:
    decoded = decode_body(body, header)
    assert (decoded.kind, decoded.content_type) == (kind, media_type)


def test_json_is_pretty_printed_with_two_spaces() -> None:
    decoded = decode_body(b'{"a":[1,2],"b":{"c":null}}', "application/json")
    assert decoded == DecodedBody(
        "json", '{\n  "a": [\n    1,\n    2\n  ],\n  "b": {\n    "c": null\n  }\n}', "application/json"
    )


def test_json_with_huge_integer_still_pretty_prints() -> None:
    decoded = decode_body(b'{"n": 123456789012345678901234567890}', "application/json")
    assert decoded.kind == "json"
    assert '"n": 123456789012345678901234567890' in decoded.text


def test_invalid_json_is_handed_over_as_text() -> None:
    decoded = decode_body(b"{not json", "application/ld+json")
    assert (decoded.kind, decoded.text) == ("text", "{not json")


@pytest.mark.parametrize(
    ("body", "header", "expected"),
    [
        pytest.param(
            "日本語のページ".encode("shift_jis"), "text/html; charset=Shift_JIS", "日本語のページ",
            id="shift-jis-header",
        ),
        pytest.param(
            b'<meta charset="shift_jis"><p>' + "日本語".encode("shift_jis"), "text/html", "日本語", id="shift-jis-meta"
        ),
        pytest.param(
            "“smart quotes” \u2013 café".encode("cp1252"), "text/plain; charset=ISO-8859-1",
            "“smart quotes” \u2013 café", id="cp1252-mislabelled-latin1",
        ),
        pytest.param(b"\xef\xbb\xbfcaf\xc3\xa9", "text/plain", "café", id="utf8-bom"),
        pytest.param(b"\xef\xbb\xbfcaf\xc3\xa9", "text/plain; charset=iso-8859-1", "café", id="bom-beats-header"),
        pytest.param("café".encode("utf-16"), "text/plain", "café", id="utf16-bom"),
        pytest.param(
            b'<html><head><meta http-equiv="Content-Type" content="text/html; charset=windows-1251">'
            + "Привет".encode("cp1251"), "text/html", "Привет", id="meta-http-equiv",
        ),
        pytest.param(
            b"<?xml version='1.0' encoding='ISO-8859-15'?><a>" + "€".encode("iso-8859-15") + b"</a>",
            "application/xml", "€", id="xml-declaration",
        ),
        pytest.param("naïve café".encode(), "text/html", "naïve café", id="undeclared-utf8"),
        pytest.param(b"caf\xe9 au lait, d\xe9j\xe0 vu", "text/plain", "café au lait", id="detected-latin"),
        pytest.param(b"ok \xff\xfe bad", "text/plain; charset=utf-8", "ok \ufffd\ufffd bad", id="bad-bytes-replaced"),
        pytest.param(b"hello", "text/plain; charset=no-such-charset", "hello", id="unknown-charset-label"),
    ],
)  # fmt: skip
def test_charset(body: bytes, header: str, expected: str) -> None:
    assert expected in decode_body(body, header).text


BINARY_BODIES = {
    "pdf": b"%PDF-1.7\n%\xe2\xe3",
    "png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
    "gif": b"GIF89a\x01\x00",
    "jpeg": b"\xff\xd8\xff\xe0\x00\x10JFIF",
    "zip": b"PK\x03\x04\x14\x00",
    "gzip": b"\x1f\x8b\x08\x00",
    "7z": b"7z\xbc\xaf\x27\x1c\x00\x04",
    "riff-wav": b"RIFF\x24\x08\x00\x00WAVEfmt ",
    "id3-mp3": b"ID3\x04\x00\x00\x00",
    "mp3-frame": b"\xff\xfb\x90\x64",
    "ogg": b"OggS\x00\x02",
    "mp4": b"\x00\x00\x00\x18ftypmp42",
    "wasm": b"\x00asm\x01\x00\x00\x00",
    "elf": b"\x7fELF\x02\x01\x01",
    "nul-bytes": b"text\x00with\x00nuls" * 10,
    "control-bytes": bytes(range(1, 9)) * 50,
}


@pytest.mark.parametrize("body", BINARY_BODIES.values(), ids=BINARY_BODIES.keys())
@pytest.mark.parametrize("header", [None, "text/html; charset=utf-8"], ids=["no-header", "labelled-html"])
def test_binary_bodies_are_refused_whatever_the_label(body: bytes, header: str | None) -> None:
    with pytest.raises(GatewayError) as caught:
        decode_body(body, header)
    assert caught.value.code is ErrorCode.UNSUPPORTED_CONTENT


@pytest.mark.parametrize(
    "header",
    [
        "application/pdf", "image/png", "image/svg+xml", "audio/mpeg", "video/mp4", "font/woff2",
        "application/octet-stream", "application/zip", "application/gzip", "application/wasm",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ],
)  # fmt: skip
def test_binary_media_types_are_refused_even_with_text_bytes(header: str) -> None:
    with pytest.raises(GatewayError) as caught:
        decode_body(b"looks like text", header)
    assert caught.value.code is ErrorCode.UNSUPPORTED_CONTENT


@pytest.mark.parametrize(
    "body",
    [b"", b"\xff" * 100, bytes(range(256)), b"<meta charset=utf-16>hi", b"\xfe\xff"],
    ids=["empty", "all-ff", "every-byte", "meta-utf16", "bom-only"],
)
def test_odd_bodies_decode_or_refuse_but_never_crash(body: bytes) -> None:
    outcome: DecodedBody | ErrorCode
    try:
        outcome = decode_body(body, "text/html")
    except GatewayError as error:
        outcome = error.code
    assert outcome is ErrorCode.UNSUPPORTED_CONTENT or isinstance(outcome, DecodedBody)


def test_valid_utf8_page_with_a_stale_legacy_meta_charset_decodes_as_utf8() -> None:
    body = '<html><head><meta charset="gb2312"></head><body><p>腾讯新闻今日要闻</p></body></html>'.encode()
    decoded = decode_body(body, "text/html")
    assert "腾讯新闻今日要闻" in decoded.text


def test_legacy_bytes_still_follow_their_meta_charset() -> None:
    body = '<html><head><meta charset="gb2312"></head><body><p>腾讯新闻</p></body></html>'.encode("gb2312")
    decoded = decode_body(body, "text/html")
    assert "腾讯新闻" in decoded.text
