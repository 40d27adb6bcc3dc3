"""web_fetch end to end: a real gateway process reading a real site on loopback origins.

Every markdown rule, link resolution, charsets, pass-through types, continuation, each refusal
code, redirects, the 64 KiB bound, robots.txt, the deadline, the reader service, the terminal
command, and the event loop staying responsive while a large page is converted.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from aiohttp import web

from gateway.policy.decide import token_digest
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, free_port, policy_document
from tests.harness.origins import HarnessLoop, Origin, OriginFactory

ROBOTS_TXT = "User-agent: *\nDisallow: /private\n"
MAX_REDIRECT_CHAIN = 10

RULES_BODY = """
<header><a href="/">Site header link</a></header>
<nav><ul><li><a href="/nav-target">Nav entry</a></li></ul></nav>
<main><article>
<h1>Markdown rules</h1>
<p>First paragraph with <a href="guide/intro.html">a relative link</a>, <a href="javascript:alert(1)">a script
link</a>, <a href="/abs/path">a rooted link</a>, <code>inline_code()</code> and &amp; entities&nbsp;&lt;decoded&gt;.
Spaces    collapse.</p>
<h2>Second level</h2>
<h3>Third level</h3>
<h4>Fourth level</h4><h5>Fifth level</h5><h6>Sixth level</h6>
<ul><li>Apple<ul><li>Green apple</li><li>Red apple<ol><li>Deep one</li></ol></li></ul></li><li>Banana</li></ul>
<ol><li>Step one</li><li>Step two</li></ol>
<pre class="language-python"><code>def double(x):
    return x  *  2
</code></pre>
<table><thead><tr><th>Name</th><th>Value</th></tr></thead>
<tbody><tr><td>pipe</td><td>a|b</td></tr><tr><td>plain</td><td>42</td></tr></tbody></table>
<p><img src="/chart.png" alt="Chart of growth"> after image.</p>
<blockquote><p>Quoted wisdom here.</p></blockquote>
<script>var scriptText = 1;</script><style>.styleText{}</style><noscript>Noscript text</noscript>
<template>Template text</template><iframe src="/frame">Iframe text</iframe><svg><text>Svg text</text></svg>
<form action="/search"><input name="q" value="Form input"><button>Form button</button></form>
<p hidden>Hidden attribute text</p><p aria-hidden="true">Aria hidden text</p>
<p style="display: none">Display none text</p><p style="visibility:hidden">Visibility hidden text</p>
<p>Final paragraph with enough words to be the article body of this test page, and so on.</p>
</article></main>
<aside>Aside boilerplate</aside>
<footer>Footer boilerplate</footer>
"""

ARTICLE_SENTENCE = "Continuation keeps every character of the page across windows. "
CJK_SENTENCE = "東京の図書館は静かな午後に多くの人々を迎え入れ、古い本の香りが漂っていた。"


def html_page(title: str, body: str, head: str = "") -> str:
    return f"<!doctype html><html><head><title>{title}</title>{head}</head><body>{body}</body></html>"


def article_page(title: str, paragraphs: list[str]) -> str:
    body = "".join(f"<p>{paragraph}</p>" for paragraph in paragraphs)
    return html_page(title, f"<main><article><h1>{title}</h1>{body}</article></main>")


def pathological_page() -> str:
    """About 10,000 elements: 3,000 nested divs, a megabyte attribute, thousands of siblings."""
    depth = 3_000
    nested = "<div>" * depth + "<p>deep text at the bottom</p>" + "</div>" * depth
    huge_attribute = f"<p title='{'x' * 1_000_000}'>big attribute paragraph</p>"
    siblings = "<span>s</span>" * 4_000
    unclosed = "<b><i>" * 1_000 + "unclosed end"
    return html_page("Pathological", nested + huge_attribute + siblings + unclosed)


def large_conversion_page(target_bytes: int) -> str:
    """An article of many paragraphs, lists and tables close to `target_bytes` of HTML."""
    block = (
        "<h2>Section</h2><p>Paragraph with <a href='/x'>a link</a>, <em>emphasis</em> and <code>code</code> "
        "that goes on for a while so the converter has real work to do on every node.</p>"
        "<ul><li>first item</li><li>second item <b>bold</b></li></ul>"
        "<table><tr><td>cell one</td><td>cell two</td></tr></table>"
    )
    count = max(1, (target_bytes - 200) // len(block))
    return html_page("Large conversion", "<article>" + block * count + "</article>")


@dataclass
class SiteState:
    """What the site saw, read by the tests (set from the harness loop's thread)."""

    changing_counter: itertools.count[int] = field(default_factory=itertools.count)
    large_body_sent: threading.Event = field(default_factory=threading.Event)
    large_page: bytes = b""


def site_app(state: SiteState) -> web.Application:
    routes = web.RouteTableDef()

    def html(text: str, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(text=text, status=status, content_type="text/html", headers=headers)

    def raw(body: bytes, content_type: str, status: int = 200) -> web.Response:
        return web.Response(body=body, status=status, headers={"Content-Type": content_type})

    @routes.get("/robots.txt")
    async def robots(request: web.Request) -> web.Response:
        host = request.host.split(":")[0]
        if host.startswith("robots404."):
            return web.Response(text="no robots here", status=404)
        if host.startswith("robots500."):
            return web.Response(text="overloaded", status=503)
        return web.Response(text=ROBOTS_TXT, content_type="text/plain")

    @routes.get("/docs/rules.html")
    async def rules_with_base(request: web.Request) -> web.Response:
        return html(html_page("Markdown rules", RULES_BODY, head='<base href="https://cdn.example.net/docs/">'))

    @routes.get("/docs/section/rules.html")
    async def rules_without_base(request: web.Request) -> web.Response:
        return html(html_page("Markdown rules", RULES_BODY))

    @routes.get("/private/page")
    @routes.get("/open/page")
    async def simple(request: web.Request) -> web.Response:
        return html(article_page("Simple page", ["A simple page with a sentence that is long enough to keep."]))

    @routes.get("/charset/sjis-header")
    async def sjis_header(request: web.Request) -> web.Response:
        page = article_page("日本語", ["日本語のテキストです。文字化けしないこと。"])
        return raw(page.encode("shift_jis"), "text/html; charset=Shift_JIS")

    @routes.get("/charset/sjis-meta")
    async def sjis_meta(request: web.Request) -> web.Response:
        page = article_page("日本語", ["メタタグで宣言された文字コードです。"]).replace(
            "<head>", '<head><meta charset="shift_jis">'
        )
        return raw(page.encode("shift_jis"), "text/html")

    @routes.get("/charset/cp1252-as-latin1")
    async def cp1252_as_latin1(request: web.Request) -> web.Response:
        page = article_page("Quotes", ["\u201cSmart quotes\u201d cost 5 \u20ac \u2014 na\u00efve caf\u00e9."])
        return raw(page.encode("cp1252"), "text/html; charset=ISO-8859-1")

    @routes.get("/charset/bom-wrong-header")
    async def bom_wrong_header(request: web.Request) -> web.Response:
        page = article_page("BOM", ["Grüße aus Köln — 東京 too."])
        return raw(b"\xef\xbb\xbf" + page.encode("utf-8"), "text/html; charset=ISO-8859-1")

    @routes.get("/notes.md")
    async def markdown(request: web.Request) -> web.Response:
        return raw(b"# Notes\n\n* kept   as is\n\n<b>not html</b>\n", "text/markdown; charset=utf-8")

    @routes.get("/data.json")
    async def json_data(request: web.Request) -> web.Response:
        return raw(b'{"name":"gateway","ports":[80,443],"nested":{"ok":true}}', "application/json")

    @routes.get("/article")
    async def article(request: web.Request) -> web.Response:
        # About 2,600 characters of text: three windows of 1,000.
        return html(article_page("Continuation", [ARTICLE_SENTENCE * 5 + f"Paragraph {n}." for n in range(8)]))

    @routes.get("/changing")
    async def changing(request: web.Request) -> web.Response:
        version = next(state.changing_counter)
        return html(article_page("Changing", [f"Version {version}. " + ARTICLE_SENTENCE * 40]))

    @routes.get("/cjk")
    async def cjk(request: web.Request) -> web.Response:
        return html(article_page("長い記事", [CJK_SENTENCE * 20 for _ in range(120)]))

    @routes.get("/redirect/{hops}")
    async def redirect(request: web.Request) -> web.Response:
        hops = min(int(request.match_info["hops"]), MAX_REDIRECT_CHAIN)
        if hops == 0:
            return html(article_page("Landed", ["The redirect chain ended on this page with its text."]))
        raise web.HTTPFound(f"/redirect/{hops - 1}")

    @routes.get("/too-large")
    async def too_large(request: web.Request) -> web.Response:
        return html(article_page("Huge", ["x" * (3 * 1024 * 1024)]))

    @routes.get("/paper.pdf")
    async def pdf(request: web.Request) -> web.Response:
        return raw(b"%PDF-1.7\n1 0 obj<<>>endobj\n", "application/pdf")

    @routes.get("/image-as-html")
    async def png_as_html(request: web.Request) -> web.Response:
        return raw(b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + b"\x00" * 64, "text/html")

    @routes.get("/challenge/cf-mitigated")
    async def cf_mitigated(request: web.Request) -> web.Response:
        return html(html_page("Hold on", "<p>checking</p>"), 403, {"cf-mitigated": "challenge"})

    @routes.get("/challenge/just-a-moment")
    async def just_a_moment(request: web.Request) -> web.Response:
        body = "<p>Checking if the site connection is secure. Cloudflare Ray ID 8a1b2c</p>"
        return html(html_page("Just a moment...", body), 503)

    @routes.get("/challenge/cf-firewall")
    async def cf_firewall(request: web.Request) -> web.Response:
        body = '<div class="cf-error-code">1020</div><p>Access denied. You have been blocked.</p>'
        return html(html_page("Attention Required! | Cloudflare", body), 403)

    @routes.get("/challenge/recaptcha")
    async def recaptcha(request: web.Request) -> web.Response:
        head = '<script src="https://www.google.com/recaptcha/api.js"></script>'
        body = '<form><div class="g-recaptcha" data-sitekey="k"></div><p>Please confirm.</p></form>'
        return html(html_page("Security check", body, head=head))

    @routes.get("/missing")
    async def missing(request: web.Request) -> web.Response:
        return html(article_page("Not Found", ["No page lives at this address; try the index instead."]), 404)

    @routes.get("/slow")
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(10)
        return html(article_page("Slow", ["Too late."]))

    @routes.get("/pathological")
    async def pathological(request: web.Request) -> web.Response:
        return html(pathological_page())

    @routes.get("/large-conversion")
    async def large_conversion(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/html; charset=utf-8"})
        response.content_length = len(state.large_page)
        await response.prepare(request)
        await response.write(state.large_page)
        await response.write_eof()
        # Every byte is with the gateway now: what it does next is conversion.
        state.large_body_sent.set()
        return response

    app = web.Application()
    app.add_routes(routes)
    return app


# ---------------------------------------------------------------------------------------------
# Fixtures: one site origin, one gateway per module (gateways are processes and start slowly).

TOKEN_NO_FETCH = "token-without-fetch"
TOKEN_DOCS_ONLY = "token-docs-only"
SITE_NAMES = ("docs.example.org", "robots404.example.org", "robots500.example.org")
LARGE_PAGE_BYTES = 1_900_000  # under the 2 MiB wire and decoded caps


@dataclass
class Site:
    origin: Origin
    badcert: Origin  # serves a certificate for another name
    state: SiteState
    closed_port: int

    @property
    def cidrs(self) -> list[str]:
        return [self.origin.cidr, self.badcert.cidr]

    @property
    def ports(self) -> list[int]:
        return [self.origin.port, self.badcert.port, self.closed_port]

    def url(self, path: str, name: str = "docs.example.org") -> str:
        return self.origin.url(path, name)


@dataclass
class Stack:
    site: Site
    gateway: GatewayProcess
    origins: OriginFactory

    def fetch(self, payload: dict[str, Any], token: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.post(f"{self.gateway.api_url}/v1/fetch", json=payload, headers=headers, timeout=30)

    def ok(self, payload: dict[str, Any]) -> dict[str, Any]:
        response = self.fetch(payload)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def refused(self, payload: dict[str, Any], token: str | None = None) -> tuple[int, dict[str, Any]]:
        response = self.fetch(payload, token)
        assert response.status_code != 200, response.text
        error: dict[str, Any] = response.json()["error"]
        assert response.headers["X-Egress-Code"] == error["code"]
        return response.status_code, error


def fetch_policy(cidrs: list[str], ports: list[int], **sections: Any) -> dict[str, Any]:
    return policy_document(
        allow_cidrs=cidrs,
        ports=[80, 443, *ports],
        principals={
            "default": {"egress": {"allow_domains": ["*"]}, "tools": {"search": False, "fetch": True}},
            "no-fetch": {
                "token_sha256": token_digest(TOKEN_NO_FETCH),
                "egress": {"allow_domains": ["*"]},
                "tools": {"search": True, "fetch": False},
            },
            "docs-only": {
                "token_sha256": token_digest(TOKEN_DOCS_ONLY),
                "egress": {"allow_domains": ["docs.example.org"]},
                "tools": {"search": False, "fetch": True},
            },
        },
        **sections,
    )


@pytest.fixture(scope="module")
def module_origins(harness_loop: HarnessLoop, pki: TestPKI, fake_dns: FakeDNS) -> Iterator[OriginFactory]:
    factory = OriginFactory(harness_loop, pki, fake_dns)
    yield factory
    factory.stop_all()


@pytest.fixture(scope="module")
def site(module_origins: OriginFactory, fake_dns: FakeDNS) -> Site:
    state = SiteState(large_page=large_conversion_page(LARGE_PAGE_BYTES).encode())
    origin = module_origins.start(site_app(state), names=SITE_NAMES)
    fake_dns.add("blocked.example.org", "10.1.2.3")
    fake_dns.add("closed.example.org", origin.ip)
    fake_dns.add("servfail.example.org", origin.ip)
    fake_dns.fail("servfail.example.org", "SERVFAIL")
    badcert = module_origins.start(
        site_app(SiteState()), names=["badcert.example.org"], cert_names=["other.example.org"]
    )
    return Site(origin, badcert, state, closed_port=free_port(origin.ip))


def start_gateway(
    tmp_path_factory: pytest.TempPathFactory,
    fake_dns: FakeDNS,
    pki: TestPKI,
    policy: dict[str, Any],
    env: dict[str, str] | None = None,
) -> GatewayProcess:
    workdir = tmp_path_factory.mktemp("fetch-gateway")
    return GatewayProcess(workdir, policy, nameserver=fake_dns.nameserver, ca_bundle=pki.ca_path, env=env).start()


@pytest.fixture(scope="module")
def stack(
    site: Site, module_origins: OriginFactory, tmp_path_factory: pytest.TempPathFactory, fake_dns: FakeDNS, pki: TestPKI
) -> Iterator[Stack]:
    policy = fetch_policy(site.cidrs, site.ports)
    gateway = start_gateway(tmp_path_factory, fake_dns, pki, policy)
    yield Stack(site, gateway, module_origins)
    gateway.stop()


# ---------------------------------------------------------------------------------------------
# Markdown through the API


def test_every_markdown_rule_is_applied_to_a_served_page(stack: Stack) -> None:
    body = stack.ok({"url": stack.site.url("/docs/rules.html")})
    content = body["content"]
    assert content.startswith("# Markdown rules\n")
    for level in range(2, 7):
        name = ["Second", "Third", "Fourth", "Fifth", "Sixth"][level - 2]
        assert f"\n{'#' * level} {name} level\n" in content
    assert "- Apple\n  - Green apple\n  - Red apple\n    1. Deep one\n- Banana" in content
    assert "1. Step one\n2. Step two" in content
    assert "```python\ndef double(x):\n    return x  *  2\n```" in content
    assert "`inline_code()`" in content
    assert "| Name | Value |\n| --- | --- |\n| pipe | a\\|b |\n| plain | 42 |" in content
    assert "Chart of growth after image." in content
    assert "chart.png" not in content
    assert "> Quoted wisdom here." in content
    assert "& entities <decoded>. Spaces collapse." in content
    assert "a script link" in content
    assert "javascript:" not in content
    assert body["title"] == "Markdown rules"
    assert body["contentType"] == "text/html"


@pytest.mark.parametrize(
    "removed",
    [
        "scriptText", "styleText", "Noscript text", "Template text", "Iframe text", "Svg text", "Form input",
        "Form button", "Hidden attribute text", "Aria hidden text", "Display none text", "Visibility hidden text",
        "Site header link", "Nav entry", "Aside boilerplate", "Footer boilerplate",
    ],
)  # fmt: skip
def test_removed_and_hidden_elements_leave_no_text(stack: Stack, removed: str) -> None:
    body = stack.ok({"url": stack.site.url("/docs/rules.html")})
    assert "Final paragraph with enough words" in body["content"]
    assert removed not in body["content"]


@pytest.mark.parametrize(
    ("path", "relative", "rooted"),
    [
        pytest.param(
            "/docs/rules.html",
            "https://cdn.example.net/docs/guide/intro.html",
            "https://cdn.example.net/abs/path",
            id="with-base-href",
        ),
        pytest.param(
            "/docs/section/rules.html",
            "{origin}/docs/section/guide/intro.html",
            "{origin}/abs/path",
            id="against-the-final-url",
        ),
    ],
)
def test_relative_links_are_made_absolute(stack: Stack, path: str, relative: str, rooted: str) -> None:
    origin = stack.site.url("").rstrip("/")
    relative, rooted = relative.format(origin=origin), rooted.format(origin=origin)
    body = stack.ok({"url": stack.site.url(path)})
    assert f"[a relative link]({relative})" in body["content"]
    assert f"[a rooted link]({rooted})" in body["content"]
    assert {"text": "a relative link", "url": relative} in body["links"]
    assert all(link["url"].startswith(("http://", "https://")) for link in body["links"])


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("/charset/sjis-header", "日本語のテキストです。文字化けしないこと。", id="shift-jis-in-header"),
        pytest.param("/charset/sjis-meta", "メタタグで宣言された文字コードです。", id="shift-jis-in-meta"),
        pytest.param(
            "/charset/cp1252-as-latin1",
            "\u201cSmart quotes\u201d cost 5 \u20ac \u2014 na\u00efve caf\u00e9.",
            id="windows-1252-labelled-latin1",
        ),
        pytest.param("/charset/bom-wrong-header", "Grüße aus Köln — 東京 too.", id="utf8-bom-beats-wrong-header"),
    ],
)
def test_charset_is_decoded_from_header_meta_or_bom(stack: Stack, path: str, expected: str) -> None:
    body = stack.ok({"url": stack.site.url(path)})
    assert expected in body["content"]
    assert "\ufffd" not in body["content"]


def test_markdown_served_by_the_site_is_passed_through_as_is(stack: Stack) -> None:
    body = stack.ok({"url": stack.site.url("/notes.md")})
    assert body["content"] == "# Notes\n\n* kept   as is\n\n<b>not html</b>\n"
    assert body["contentType"] == "text/markdown"


def test_json_is_pretty_printed(stack: Stack) -> None:
    body = stack.ok({"url": stack.site.url("/data.json")})
    assert body["content"] == (
        '{\n  "name": "gateway",\n  "ports": [\n    80,\n    443\n  ],\n  "nested": {\n    "ok": true\n  }\n}'
    )
    assert body["contentType"] == "application/json"


def test_result_carries_every_documented_field(stack: Stack) -> None:
    url = stack.site.url("/open/page")
    body = stack.ok({"url": url})
    assert body["url"] == url
    assert body["finalUrl"] == url
    assert body["retrievedAt"].endswith("Z")
    assert body["contentHash"] == hashlib.sha256(body["content"].encode()).hexdigest()
    assert (body["offset"], body["nextOffset"], body["truncated"], body["sourceTruncated"]) == (0, None, False, False)
    assert body["totalChars"] == len(body["content"])
    assert "untrusted" in body["notice"]
    assert set(body) == {
        "url", "finalUrl", "title", "contentType", "retrievedAt", "content", "contentHash", "offset",
        "nextOffset", "totalChars", "truncated", "sourceTruncated", "contentChanged", "links", "controlCharsRemoved",
        "notice", "budget",
    }  # fmt: skip
    assert body["contentChanged"] is None
    assert body["controlCharsRemoved"] == 0


# ---------------------------------------------------------------------------------------------
# Continuation


def read_all_windows(stack: Stack, url: str, max_chars: int) -> list[dict[str, Any]]:
    windows = [stack.ok({"url": url, "maxChars": max_chars})]
    while windows[-1]["nextOffset"] is not None:
        last = windows[-1]
        windows.append(
            stack.ok(
                {"url": url, "maxChars": max_chars, "offset": last["nextOffset"], "expectedHash": last["contentHash"]}
            )
        )
        assert len(windows) < 50
    return windows


def test_three_windows_with_matching_hashes_concatenate_to_the_whole_text(stack: Stack) -> None:
    url = stack.site.url("/article")
    whole = stack.ok({"url": url, "maxChars": 32_000})
    windows = read_all_windows(stack, url, 1_000)
    assert len(windows) == 3
    assert "".join(window["content"] for window in windows) == whole["content"]
    assert {window["contentHash"] for window in windows} == {whole["contentHash"]}
    assert [window["offset"] for window in windows] == [0, 1_000, 2_000]
    assert [window["truncated"] for window in windows] == [True, True, False]
    assert windows[-1]["nextOffset"] is None
    assert windows[0]["totalChars"] == len(whole["content"])


def test_a_page_that_changed_between_windows_is_content_changed(stack: Stack) -> None:
    url = stack.site.url("/changing")
    first = stack.ok({"url": url, "maxChars": 1_000})
    assert first["nextOffset"] == 1_000
    status, error = stack.refused(
        {"url": url, "maxChars": 1_000, "offset": 1_000, "expectedHash": first["contentHash"]}
    )
    assert (status, error["code"]) == (409, "content_changed")


def test_continuation_without_expected_hash_says_the_page_did_not_change(stack: Stack) -> None:
    url = stack.site.url("/article")
    first = stack.ok({"url": url, "maxChars": 1_000})
    second = stack.ok({"url": url, "maxChars": 1_000, "offset": first["nextOffset"]})
    assert second["contentChanged"] is False
    assert second["contentHash"] == first["contentHash"]
    with_hash = stack.ok({"url": url, "maxChars": 1_000, "offset": 1_000, "expectedHash": first["contentHash"]})
    assert with_hash["contentChanged"] is False


def test_continuation_without_expected_hash_says_the_page_changed_instead_of_refusing(stack: Stack) -> None:
    url = stack.site.url("/changing")
    first = stack.ok({"url": url, "maxChars": 1_000})
    second = stack.ok({"url": url, "maxChars": 1_000, "offset": first["nextOffset"]})
    assert second["contentChanged"] is True
    assert second["contentHash"] != first["contentHash"]


def test_small_windows_from_100_characters_cover_the_whole_text(stack: Stack) -> None:
    url = stack.site.url("/article")
    windows = read_all_windows(stack, url, 100)
    whole = stack.ok({"url": url, "maxChars": 32_000})
    assert all(len(window["content"]) <= 100 for window in windows)
    assert "".join(window["content"] for window in windows) == whole["content"]


def test_text_format_has_no_markup_and_html_format_is_the_cleaned_article(stack: Stack) -> None:
    url = stack.site.url("/docs/rules.html")
    text = stack.ok({"url": url, "format": "text"})["content"]
    assert text.startswith("Markdown rules\n")
    assert "Second level\n" in text
    assert "a relative link" in text
    for markup in ("](", "## ", "```", "| --- |"):
        assert markup not in text
    markup = stack.ok({"url": url, "format": "html"})["content"]
    assert '<a href="https://cdn.example.net/docs/guide/intro.html">a relative link</a>' in markup
    assert "<h2>Second level</h2>" in markup
    assert "Nav entry" not in markup
    assert "scriptText" not in markup


@pytest.mark.parametrize(
    ("links", "expected", "absent"),
    [
        pytest.param("none", "with a relative link,", "](", id="none"),
        pytest.param("references", "[a relative link][1]", "](", id="references"),
        pytest.param("inline", "[a relative link](https://cdn.example.net/docs/guide/intro.html)", "][1]", id="inline"),
    ],
)
def test_links_argument_chooses_how_urls_are_written(stack: Stack, links: str, expected: str, absent: str) -> None:
    body = stack.ok({"url": stack.site.url("/docs/rules.html"), "links": links})
    assert expected in body["content"]
    assert absent not in body["content"]
    assert "https://cdn.example.net/docs/guide/intro.html" in {link["url"] for link in body["links"]}
    if links == "references":
        assert "\n[1]: https://cdn.example.net/docs/guide/intro.html\n" in body["content"]


def test_cjk_response_stays_under_64_kib_and_continuation_covers_all_text(stack: Stack) -> None:
    url = stack.site.url("/cjk")
    first = stack.fetch({"url": url, "maxChars": 32_000})
    assert first.status_code == 200
    assert len(first.content) < 65_536
    windows = [first.json()]
    while windows[-1]["nextOffset"] is not None:
        last = windows[-1]
        response = stack.fetch(
            {"url": url, "maxChars": 32_000, "offset": last["nextOffset"], "expectedHash": last["contentHash"]}
        )
        assert response.status_code == 200, response.text
        assert len(response.content) < 65_536
        windows.append(response.json())
    text = "".join(window["content"] for window in windows)
    assert len(windows) >= 2
    assert len(text) == windows[0]["totalChars"]
    assert hashlib.sha256(text.encode()).hexdigest() == windows[0]["contentHash"]
    assert text.count(CJK_SENTENCE) == 20 * 120


def test_pathological_page_answers_without_error(stack: Stack) -> None:
    body = stack.ok({"url": stack.site.url("/pathological")})
    assert body["content"].startswith("# Pathological")
    assert "big attribute paragraph" in body["content"]
    assert "x" * 1_000 not in body["content"]


# ---------------------------------------------------------------------------------------------
# Redirects and refusals


def test_a_chain_of_four_redirects_is_followed(stack: Stack) -> None:
    body = stack.ok({"url": stack.site.url("/redirect/4")})
    assert body["finalUrl"] == stack.site.url("/redirect/0")
    assert "redirect chain ended" in body["content"]


def test_a_fifth_redirect_is_redirect_blocked(stack: Stack) -> None:
    status, error = stack.refused({"url": stack.site.url("/redirect/5")})
    assert (status, error["code"]) == (403, "redirect_blocked")
    assert "more than 4 redirects" in error["message"]


@pytest.mark.parametrize(
    ("url", "status", "code"),
    [
        pytest.param("https://docs.example.org/page?api_key=abc123", 400, "unsafe_url", id="secret-query-parameter"),
        pytest.param("https://user:pw@docs.example.org/page", 400, "unsafe_url", id="userinfo"),
        pytest.param("http://metadata.google.internal/computeMetadata/v1/", 400, "unsafe_url", id="internal-name"),
        pytest.param("ftp://docs.example.org/file", 400, "unsafe_url", id="ftp-scheme"),
        pytest.param("https://docs.example.org/" + "a" * 4_100, 400, "unsafe_url", id="url-over-4096-characters"),
        pytest.param("https://blocked.example.org/", 403, "blocked_destination", id="name-resolving-to-private"),
        pytest.param("https://nxdomain.example.org/", 502, "dns_failure", id="nxdomain"),
        pytest.param("https://servfail.example.org/", 502, "dns_failure", id="servfail"),
    ],
)
def test_unreachable_or_unsafe_targets_are_refused_with_their_code(
    stack: Stack, url: str, status: int, code: str
) -> None:
    got_status, error = stack.refused({"url": url})
    assert (got_status, error["code"]) == (status, code), error


def test_a_closed_port_is_connect_failure(stack: Stack) -> None:
    url = f"http://closed.example.org:{stack.site.closed_port}/page"
    status, error = stack.refused({"url": url})
    assert (status, error["code"], error["retryable"]) == (502, "connect_failure", True)


def test_a_certificate_for_another_name_is_connect_failure(stack: Stack) -> None:
    status, error = stack.refused({"url": stack.site.badcert.url("/open/page")})
    assert (status, error["code"]) == (502, "connect_failure")
    assert "certificate" in error["message"].lower()


@pytest.mark.parametrize(
    ("token", "host"),
    [
        pytest.param(TOKEN_NO_FETCH, "docs.example.org", id="principal-without-fetch-switch"),
        pytest.param(TOKEN_DOCS_ONLY, "robots404.example.org", id="host-not-allowed-for-principal"),
    ],
)
def test_policy_denied(stack: Stack, token: str, host: str) -> None:
    status, error = stack.refused({"url": stack.site.url("/open/page", host)}, token=token)
    assert (status, error["code"]) == (403, "policy_denied")


def test_the_allowed_principal_reaches_its_host(stack: Stack) -> None:
    response = stack.fetch({"url": stack.site.url("/open/page")}, token=TOKEN_DOCS_ONLY)
    assert response.status_code == 200, response.text


def test_a_page_over_the_wire_cap_is_too_large(stack: Stack) -> None:
    status, error = stack.refused({"url": stack.site.url("/too-large")})
    assert (status, error["code"]) == (502, "too_large")


@pytest.mark.parametrize("path", ["/paper.pdf", "/image-as-html"], ids=["pdf", "png-labelled-text-html"])
def test_binary_bodies_are_unsupported_content(stack: Stack, path: str) -> None:
    status, error = stack.refused({"url": stack.site.url(path)})
    assert (status, error["code"]) == (415, "unsupported_content")


@pytest.mark.parametrize(
    "path",
    ["/challenge/cf-mitigated", "/challenge/just-a-moment", "/challenge/cf-firewall", "/challenge/recaptcha"],
    ids=["cf-mitigated-header", "just-a-moment-title", "cloudflare-403-cf-error-code", "recaptcha-interstitial"],
)
def test_bot_challenges_are_challenged_not_content(stack: Stack, path: str) -> None:
    status, error = stack.refused({"url": stack.site.url(path)})
    assert (status, error["code"]) == (403, "challenged")
    assert "page" not in error


def test_robots_disallowed_names_the_rule(stack: Stack) -> None:
    status, error = stack.refused({"url": stack.site.url("/private/page")})
    assert (status, error["code"]) == (403, "robots_disallowed")
    assert "Disallow: /private" in error["message"]


def test_a_4xx_robots_txt_allows_everything(stack: Stack) -> None:
    body = stack.ok({"url": stack.site.url("/private/page", "robots404.example.org")})
    assert "simple page" in body["content"]


def test_a_5xx_robots_txt_disallows_everything(stack: Stack) -> None:
    status, error = stack.refused({"url": stack.site.url("/open/page", "robots500.example.org")})
    assert (status, error["code"]) == (403, "robots_disallowed")
    assert "503" in error["message"]


def test_an_http_error_is_upstream_status_with_the_page_text(stack: Stack) -> None:
    status, error = stack.refused({"url": stack.site.url("/missing")})
    assert (status, error["code"], error["status"]) == (502, "upstream_status", 404)
    assert "404" in error["message"]
    assert "No page lives at this address" in error["page"]


# ---------------------------------------------------------------------------------------------
# Deadline, reader service, terminal, and the event loop during a large conversion


@pytest.fixture(scope="module")
def slow_gateway(
    site: Site, tmp_path_factory: pytest.TempPathFactory, fake_dns: FakeDNS, pki: TestPKI
) -> Iterator[GatewayProcess]:
    policy = fetch_policy(site.cidrs, site.ports, fetch={"deadline_s": 1})
    gateway = start_gateway(tmp_path_factory, fake_dns, pki, policy)
    yield gateway
    gateway.stop()


def test_a_slow_origin_past_the_policy_deadline_is_timeout(site: Site, slow_gateway: GatewayProcess) -> None:
    response = httpx.post(f"{slow_gateway.api_url}/v1/fetch", json={"url": site.url("/slow")}, timeout=30)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "timeout"
    assert "1 s deadline" in response.json()["error"]["message"]


@dataclass
class Reader:
    origin: Origin
    seen: list[tuple[str, str | None]]  # (page url asked for, Authorization header)


READER_KEY = "reader-secret-key"


def reader_app(seen: list[tuple[str, str | None]]) -> web.Application:
    async def read(request: web.Request) -> web.Response:
        page = request.query.get("u", "")
        seen.append((page, request.headers.get("Authorization")))
        if "redirect-me" in page:
            raise web.HTTPFound("/read?u=elsewhere")
        return web.Response(text=f"Reader text for {page}\n", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/read", read)
    return app


@pytest.fixture(scope="module")
def reader_gateway(
    site: Site, module_origins: OriginFactory, tmp_path_factory: pytest.TempPathFactory, fake_dns: FakeDNS, pki: TestPKI
) -> Iterator[tuple[Reader, GatewayProcess]]:
    seen: list[tuple[str, str | None]] = []
    origin = module_origins.start(reader_app(seen), names=["reader.example.org"])
    env = {
        "EGRESS_FETCH_READER_URL": origin.url("/read?u={url}"),
        "EGRESS_FETCH_READER_KEY": READER_KEY,
    }
    policy = fetch_policy([*site.cidrs, origin.cidr], [*site.ports, origin.port])
    gateway = start_gateway(tmp_path_factory, fake_dns, pki, policy, env)
    yield Reader(origin, seen), gateway
    gateway.stop()


def test_the_reader_service_returns_its_text_and_receives_the_key_as_bearer(
    site: Site, reader_gateway: tuple[Reader, GatewayProcess]
) -> None:
    reader, gateway = reader_gateway
    page = site.url("/private/page")  # the reader fetches: no robots.txt check by the gateway
    response = httpx.post(f"{gateway.api_url}/v1/fetch", json={"url": page}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["content"] == f"Reader text for {page}\n"
    assert (page, f"Bearer {READER_KEY}") in reader.seen


def test_the_reader_service_redirect_is_not_followed_with_the_key(
    site: Site, reader_gateway: tuple[Reader, GatewayProcess]
) -> None:
    reader, gateway = reader_gateway
    response = httpx.post(f"{gateway.api_url}/v1/fetch", json={"url": site.url("/redirect-me")}, timeout=30)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "redirect_blocked"
    assert not any(page == "elsewhere" for page, _ in reader.seen)


def test_cli_fetch_prints_the_page_as_markdown(stack: Stack) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "gateway", "fetch", stack.site.url("/docs/rules.html"), "--max-chars", "2000"],
        env=stack.gateway.env,
        cwd=stack.gateway.workdir,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("# Markdown rules\n")
    assert "## Second level" in completed.stdout
    assert completed.stdout.rstrip().endswith("the article body of this test page, and so on.")


REQUIRED_ANSWERS_DURING_CONVERSION = 5


@pytest.mark.serial  # a conversion that takes seconds of CPU, answered within 30 s: needs the machine to itself
def test_requests_are_answered_while_a_large_conversion_runs(stack: Stack) -> None:
    state = stack.site.state
    state.large_body_sent.clear()
    outcome: dict[str, httpx.Response] = {}

    def fetch_large_page() -> None:
        outcome["response"] = stack.fetch({"url": stack.site.url("/large-conversion"), "maxChars": 1_000})

    big = threading.Thread(target=fetch_large_page, name="large-fetch")
    answered_during_conversion = 0
    with httpx.Client(timeout=30) as client:
        big.start()
        while big.is_alive():
            response = client.get(f"{stack.gateway.admin_url}/healthz")
            assert response.status_code == 200
            # Counted only when the page is fully with the gateway and its answer has not come back.
            if state.large_body_sent.is_set() and big.is_alive():
                answered_during_conversion += 1
    big.join()
    response = outcome["response"]
    assert response.status_code == 200, response.text
    assert response.json()["sourceTruncated"] is True  # 400,000 characters of markdown: real work
    assert answered_during_conversion >= REQUIRED_ANSWERS_DURING_CONVERSION
