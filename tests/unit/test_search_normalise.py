"""Normalisation shared by every engine: redirects, unsafe links, duplicates, text, the cut."""

from __future__ import annotations

import pytest

from gateway.tools.search.engine import RawRow
from gateway.tools.search.links import dedupe_key, unsafe_reason, unwrap_redirect
from gateway.tools.search.normalise import normalise_rows, plain_text


@pytest.mark.parametrize(
    ("wrapped", "destination"),
    [
        pytest.param(
            "//duckduckgo.com/l/?uddg=https%3A%2F%2Fexample.com%2Fa%3Fb%3D1&rut=x",
            "https://example.com/a?b=1",
            id="ddg-uddg-scheme-relative",
        ),
        pytest.param(
            "https://www.bing.com/ck/a?!&amp;&amp;p=1&amp;u=a1aHR0cHM6Ly93d3cudzNzY2hvb2xzLmNvbS9Kcy8&amp;ntb=1",
            "https://www.w3schools.com/Js/",
            id="bing-ck-a-html-escaped",
        ),
        pytest.param(
            "https://cn.bing.com/ck/a?u=a1aHR0cHM6Ly9leGFtcGxlLmNvbS8",
            "https://example.com/",
            id="bing-cn-host",
        ),
        pytest.param(
            "https://www.bing.com/ck/a?u=a1L2ltYWdlcy9zZWFyY2g_cT14",
            "https://www.bing.com/images/search?q=x",
            id="bing-relative-vertical",
        ),
        pytest.param(
            "https://example.com/l/?uddg=https%3A%2F%2Fevil.test",
            "https://example.com/l/?uddg=https%3A%2F%2Fevil.test",
            id="not-a-ddg-host",
        ),
        pytest.param("https://example.com/page", "https://example.com/page", id="plain-link"),
    ],
)
def test_redirect_wrappers_are_decoded(wrapped: str, destination: str) -> None:
    assert unwrap_redirect(wrapped) == destination


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        pytest.param("https://example.com/", None, id="public-https"),
        pytest.param("http://sub.example.co.uk:8080/x", None, id="public-http-port"),
        pytest.param("ftp://example.com/f", "scheme", id="ftp"),
        pytest.param("javascript:alert(1)", "scheme", id="javascript"),
        pytest.param("data:text/html,hi", "scheme", id="data"),
        pytest.param("https://user:pw@example.com/", "userinfo", id="userinfo"),
        pytest.param("https://127.0.0.1/", "IP-literal", id="dotted-loopback"),
        pytest.param("http://2130706433/", "IP-literal", id="decimal-loopback"),
        pytest.param("http://0x7f000001/", "IP-literal", id="hex-loopback"),
        pytest.param("http://0177.0.0.1/", "IP-literal", id="octal-loopback"),
        pytest.param("http://127.1/", "IP-literal", id="short-loopback"),
        pytest.param("http://[::1]/", "IP-literal", id="ipv6-loopback"),
        pytest.param("http://[::ffff:169.254.169.254]/", "IP-literal", id="mapped-metadata"),
        pytest.param("http://8.8.8.8/", "IP-literal", id="public-ip-literal"),
        pytest.param("http://localhost/", "internal or metadata name", id="localhost"),
        pytest.param("http://app.localhost/", "under .localhost", id="sub-localhost"),
        pytest.param("http://intranet/", "single-label", id="single-label"),
        pytest.param("http://db.internal/", "under .internal", id="internal"),
        pytest.param("http://printer.local/", "under .local", id="mdns-local"),
        pytest.param("http:///path", "no host", id="no-host"),
    ],
)
def test_unsafe_links_are_named(url: str, reason: str | None) -> None:
    verdict = unsafe_reason(url)
    if reason is None:
        assert verdict is None
    else:
        assert verdict is not None
        assert reason in verdict


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param("HTTPS://Example.COM/a", "https://example.com/a", id="scheme-and-host-case"),
        pytest.param("https://example.com:443/a", "https://example.com/a", id="default-port"),
        pytest.param("https://example.com/a#top", "https://example.com/a", id="fragment"),
        pytest.param("https://example.com/a/", "https://example.com/a", id="trailing-slash"),
        pytest.param("https://example.com/a?utm_source=x&id=1", "https://example.com/a?id=1", id="utm"),
        pytest.param("https://example.com/a?gclid=1", "https://example.com/a", id="gclid"),
        pytest.param("https://example.com/a?fbclid=1", "https://example.com/a", id="fbclid"),
        pytest.param("https://example.com/a?msclkid=1", "https://example.com/a", id="msclkid"),
    ],
)
def test_urls_that_differ_only_in_form_are_duplicates(a: str, b: str) -> None:
    assert dedupe_key(a) == dedupe_key(b)


def test_different_queries_are_not_duplicates() -> None:
    assert dedupe_key("https://example.com/a?id=1") != dedupe_key("https://example.com/a?id=2")


def _row(url: str, title: str = "T", **kw: object) -> RawRow:
    return RawRow(title=title, url=url, snippet=str(kw.get("snippet", "")), sponsored=bool(kw.get("sponsored", False)))


def test_rows_are_filtered_deduped_and_cleaned() -> None:
    rows = [
        _row("https://ads.example.com/", sponsored=True),
        _row("https://duckduckgo.com/y.js?ad_provider=x"),
        _row("https://www.bing.com/aclick?ld=1"),
        _row("https://example.com/a?utm_source=news&id=1"),
        _row("https://EXAMPLE.com/a/?id=1#frag"),
        _row("http://10.0.0.1/"),
        _row("https://example.org/b"),
    ]
    result = normalise_rows(rows, max_results=10, site=None)
    assert [h.url for h in result.hits] == ["https://example.com/a?id=1", "https://example.org/b"]
    assert result.dropped == 5
    assert result.truncated is False


def test_site_keeps_the_domain_and_its_subdomains_only() -> None:
    rows = [
        _row("https://docs.rs/tokio"),
        _row("https://www.docs.rs/serde"),
        _row("https://notdocs.rs/x"),
        _row("https://docs.rs.evil.com/x"),
    ]
    hits = normalise_rows(rows, max_results=10, site="docs.rs").hits
    assert [h.url for h in hits] == ["https://docs.rs/tokio", "https://www.docs.rs/serde"]


def test_results_never_exceed_max_and_truncated_says_so() -> None:
    rows = [_row(f"https://example.com/{i}") for i in range(5)]
    exact = normalise_rows(rows, max_results=5, site=None)
    cut = normalise_rows(rows, max_results=3, site=None)
    assert (len(exact.hits), exact.truncated) == (5, False)
    assert (len(cut.hits), cut.truncated) == (3, True)


def test_missing_title_falls_back_to_host() -> None:
    hits = normalise_rows([_row("https://example.com/x", title="")], max_results=1, site=None).hits
    assert hits[0].title == "example.com"


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        pytest.param("<b>Rust</b> &amp; <em>Go</em>", "Rust & Go", id="tags-and-entities"),
        pytest.param("a &amp;lt;script&amp;gt; b", "a b", id="double-escaped-markup"),
        pytest.param("  many\n\t spaces  ", "many spaces", id="whitespace"),
        # Bidi overrides and controls are removed (and counted) at the tool's edge: terminal_safe.
        pytest.param("zero\u200bwidth\u202e", "zero width\u202e", id="zero-width-characters"),
        pytest.param("&#187; next", "» next", id="numeric-entity"),
    ],
)
def test_text_is_plain(raw: str, text: str) -> None:
    assert plain_text(raw, 100) == text


def test_text_is_cut_at_its_limit() -> None:
    assert plain_text("word " * 100, 20).endswith("…")
    assert len(plain_text("word " * 100, 20)) <= 20
