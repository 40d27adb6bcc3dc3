"""HTML to markdown: every markdown rule, link resolution, hidden content, main-content choice."""

from __future__ import annotations

from pathlib import Path

import pytest
from selectolax.lexbor import LexborHTMLParser

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.extract.main_content_measure import TextStats, surely_holds, text_length
from gateway.tools.extract.markdown import Extraction, Link, html_to_markdown

PAGE_URL = "https://news.example.org/world/story.html"
FIXTURE_PAGES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "pages"
FILLER = (
    "The council met on Tuesday to debate the budget, which has grown every year since the "
    "bridge opened, and members argued late into the evening about roads, schools and parks."
)


def page(body: str, *, head: str = "<title>Story</title>") -> str:
    return f"<html><head>{head}</head><body>{body}</body></html>"


def article(inner: str) -> str:
    """A page whose article is clearly the main content, so rules apply to `inner`."""
    return page(f"<article><p>{FILLER}</p>{inner}<p>{FILLER}</p></article>")


def body_of(html: str, base_url: str = PAGE_URL) -> str:
    return html_to_markdown(html, base_url).markdown


@pytest.mark.parametrize(
    ("inner", "expected"),
    [
        pytest.param("<h2>Budget</h2>", "## Budget", id="heading-h2"),
        pytest.param("<h6>Small print</h6>", "###### Small print", id="heading-h6"),
        pytest.param("<p>One.</p><p>Two.</p>", "One.\n\nTwo.", id="paragraphs-one-blank-line"),
        pytest.param("<p>a  \n\t b</p>", "a b", id="whitespace-collapsed"),
        pytest.param("<p>Tom &amp; Jerry &lt;3 &eacute;t&eacute;</p>", "Tom & Jerry <3 été", id="entities"),
        pytest.param("<ul><li>red</li><li>green</li></ul>", "- red\n- green", id="unordered-list"),
        pytest.param("<ol><li>first</li><li>second</li></ol>", "1. first\n2. second", id="ordered-list"),
        pytest.param("<ol start='4'><li>four</li></ol>", "4. four", id="ordered-list-start"),
        pytest.param(
            "<ul><li>fruit<ul><li>apple</li><li>pear</li></ul></li><li>veg</li></ul>",
            "- fruit\n  - apple\n  - pear\n- veg",
            id="nested-lists",
        ),
        pytest.param(
            "<ol><li>step<ul><li>detail</li></ul></li></ol>",
            "1. step\n   - detail",
            id="bullets-inside-numbered",
        ),
        pytest.param("<p>run <code>make test</code> now</p>", "run `make test` now", id="inline-code"),
        pytest.param(
            '<pre class="language-python">def f():\n    return 1</pre>',
            "```python\ndef f():\n    return 1\n```",
            id="pre-language-class",
        ),
        pytest.param(
            '<pre><code class="lang-rust">fn main() {}</code></pre>',
            "```rust\nfn main() {}\n```",
            id="pre-code-lang-class",
        ),
        pytest.param("<pre>  keep   spacing</pre>", "```\n  keep   spacing\n```", id="pre-keeps-whitespace"),
        pytest.param("<p>a <img src='x.png' alt='a red bicycle'> b</p>", "a a red bicycle b", id="image-alt"),
        pytest.param("<p>a <img src='x.png'> b</p>", "a b", id="image-without-alt-dropped"),
        pytest.param(
            "<blockquote><p>To be.</p><p>Or not.</p></blockquote>",
            "> To be.\n>\n> Or not.",
            id="blockquote",
        ),
        pytest.param("<p>line one<br>line two</p>", "line one\nline two", id="line-break"),
    ],
)
def test_markdown_rule(inner: str, expected: str) -> None:
    assert expected in body_of(article(inner))


def test_title_comes_first_as_level_one_heading() -> None:
    result = html_to_markdown(article("<p>Body.</p>"), PAGE_URL)
    assert result.title == "Story"
    assert result.markdown.startswith("# Story\n\n")


@pytest.mark.parametrize(
    ("href", "head", "expected"),
    [
        pytest.param("../photos/a.html", "", "https://news.example.org/photos/a.html", id="relative"),
        pytest.param("/about", "", "https://news.example.org/about", id="root-relative"),
        pytest.param("//cdn.example.net/x", "", "https://cdn.example.net/x", id="scheme-relative"),
        pytest.param("#section", "", f"{PAGE_URL}#section", id="fragment"),
        pytest.param(
            "a.html", '<base href="https://mirror.example.com/docs/">',
            "https://mirror.example.com/docs/a.html", id="base-href-absolute",
        ),
        pytest.param("a.html", '<base href="/v2/">', "https://news.example.org/v2/a.html", id="base-href-relative"),
        pytest.param("https://other.example/x", "", "https://other.example/x", id="absolute-kept"),
        pytest.param("HTTP://Other.example/x", "", "HTTP://Other.example/x", id="absolute-upper-case-scheme"),
        pytest.param("/a/./b/../c", "", "https://news.example.org/a/c", id="root-relative-dot-segments"),
        pytest.param("/a&#9;b", "", "https://news.example.org/ab", id="root-relative-with-tab"),
        pytest.param("  /padded  ", "", "https://news.example.org/padded", id="root-relative-padded"),
        pytest.param("#top", '<base href="https://mirror.example.com/d/p.html#x">',
                     "https://mirror.example.com/d/p.html#top", id="fragment-against-base"),
    ],
)  # fmt: skip
def test_links_resolve_against_base(href: str, head: str, expected: str) -> None:
    html = page(f"<article><p>{FILLER} <a href='{href}'>the link</a></p></article>", head=head)
    result = html_to_markdown(html, PAGE_URL)
    assert f"[the link]({expected})" in result.markdown
    assert result.links == (Link(text="the link", url=expected),)


@pytest.mark.parametrize(
    "href",
    [
        pytest.param("javascript:void(0)", id="javascript"),
        pytest.param("data:text/html,hi", id="data"),
        pytest.param("", id="empty"),
        pytest.param(None, id="no-href"),
    ],
)
def test_dead_links_keep_their_words(href: str | None) -> None:
    anchor = "<a>the words</a>" if href is None else f"<a href='{href}'>the words</a>"
    result = html_to_markdown(article(f"<p>see {anchor} here</p>"), PAGE_URL)
    assert "see the words here" in result.markdown
    assert result.links == ()


def test_link_without_words_is_dropped() -> None:
    assert "](" not in body_of(article("<p>x <a href='/a'><img src='i.png'></a> y</p>"))


def test_links_are_capped_deduplicated_and_web_only() -> None:
    anchors = "".join(f"<a href='/p{i}'>page {i}</a>, " for i in range(30))
    html = article(f"<p>{anchors} <a href='/p1'>again</a> <a href='mailto:a@b.c'>mail</a></p>")
    result = html_to_markdown(html, PAGE_URL, max_links=5)
    assert [link.url for link in result.links] == [f"https://news.example.org/p{i}" for i in range(5)]


def test_table_becomes_markdown_table_with_escaped_pipes() -> None:
    table = (
        "<table><tr><th>Name</th><th>Value</th></tr>"
        "<tr><td>a|b</td><td>1</td></tr><tr><td>c</td><td>2</td></tr></table>"
    )
    assert "| Name | Value |\n| --- | --- |\n| a\\|b | 1 |\n| c | 2 |" in body_of(article(table))


@pytest.mark.parametrize(
    "table",
    [
        pytest.param("<table><tr><td><p>Laid out text.</p></td></tr></table>", id="one-cell"),
        pytest.param(
            "<table><tr><td>Laid out text.</td></tr><tr><td>More.</td></tr></table>",
            id="single-column",
        ),
        pytest.param(
            "<table><tr><td><table><tr><td>Laid out text.</td><td>x</td></tr></table></td><td>More.</td></tr></table>",
            id="nested",
        ),
    ],
)
def test_layout_tables_are_flattened_to_text(table: str) -> None:
    markdown = body_of(article(table))
    assert "Laid out text." in markdown
    assert "| --- |" not in markdown


@pytest.mark.parametrize(
    "hidden",
    [
        pytest.param("<p hidden>SECRET</p>", id="hidden-attribute"),
        pytest.param("<p aria-hidden='true'>SECRET</p>", id="aria-hidden"),
        pytest.param("<p style='display: none'>SECRET</p>", id="display-none"),
        pytest.param("<p style='color:red;VISIBILITY:hidden'>SECRET</p>", id="visibility-hidden"),
        pytest.param("<script>var SECRET = 1;</script>", id="script"),
        pytest.param("<style>.SECRET{}</style>", id="style"),
        pytest.param("<noscript>SECRET</noscript>", id="noscript"),
        pytest.param("<template><p>SECRET</p></template>", id="template"),
        pytest.param("<svg><text>SECRET</text></svg>", id="svg"),
        pytest.param("<p>ok<button>SECRET</button><textarea>SECRET</textarea></p>", id="controls"),
        pytest.param("<p>ok<select><option>SECRET</option></select></p>", id="select"),
        pytest.param("<nav><a href='/'>SECRET</a></nav>", id="nav"),
        pytest.param("<aside>SECRET related</aside>", id="aside"),
        pytest.param("<footer>SECRET copyright</footer>", id="footer"),
        pytest.param("<form><label>SECRET search</label><input name=q></form>", id="small-form"),
        pytest.param("<div class='social-share'><a href='/s'>SECRET</a></div>", id="share-bar"),
    ],
)
def test_hidden_and_chrome_elements_are_removed(hidden: str) -> None:
    markdown = body_of(article(hidden))
    assert "SECRET" not in markdown
    assert "council met" in markdown


def test_page_wrapped_in_one_form_keeps_its_text() -> None:
    html = page(
        "<form id='aspnetForm' action='/default.aspx'><input type='hidden' name='__VIEWSTATE'>"
        f"<div id='content'><h1>Minutes</h1><p>{FILLER}</p><p>{FILLER}</p></div></form>"
    )
    assert "council met on Tuesday" in body_of(html)


def test_main_content_wins_over_menus_comments_and_related_links() -> None:
    menu = "<ul class='menu'>" + "".join(f"<li><a href='/s{i}'>MENU{i}</a></li>" for i in range(12)) + "</ul>"
    related = "<div class='related'>" + "".join(f"<a href='/r{i}'>RELATED story {i}</a> " for i in range(8)) + "</div>"
    comments = f"<div id='comments'><p>COMMENT: {FILLER}</p></div>"
    cookie = "<div class='cookie-consent'>COOKIE we use cookies <a href='/ok'>Accept</a></div>"
    html = page(
        f"{cookie}<div id='header'>{menu}</div><div id='main'><article>"
        f"<h1>Budget</h1><p>{FILLER}</p><p>{FILLER}</p><p>{FILLER}</p></article>{related}</div>"
        f"{comments}"
    )  # fmt: skip
    markdown = body_of(html)
    assert "council met" in markdown
    for chrome in ("MENU", "RELATED", "COMMENT", "COOKIE"):
        assert chrome not in markdown


def test_max_chars_truncates_and_says_so() -> None:
    html = article("".join(f"<p>{FILLER} {i}</p>" for i in range(200)))
    result = html_to_markdown(html, PAGE_URL, max_chars=1_000)
    assert result.source_truncated
    assert len(result.markdown) <= 1_001
    assert not html_to_markdown(html, PAGE_URL).source_truncated


@pytest.mark.parametrize(
    "html",
    [
        pytest.param("", id="empty"),
        pytest.param("plain words, no tags", id="no-markup"),
        pytest.param("<html><body></body></html>", id="empty-body"),
        pytest.param("<<<>>><p <a href=>", id="garbage"),
        pytest.param("<a href='http://[::1'>bad ipv6</a>", id="invalid-url"),
    ],
)
def test_odd_input_never_raises(html: str) -> None:
    assert isinstance(html_to_markdown(html, PAGE_URL), Extraction)


def test_bad_limits_are_invalid_input() -> None:
    with pytest.raises(GatewayError) as caught:
        html_to_markdown("<p>x</p>", PAGE_URL, max_chars=0)
    assert caught.value.code is ErrorCode.INVALID_INPUT


@pytest.mark.parametrize(
    "html",
    [
        pytest.param("<div>" * 10_000 + "deep text" + "</div>" * 10_000, id="10000-deep-divs"),
        pytest.param(
            "<div>" * 10_000 + f"<p>{FILLER} <a href='/x'>more</a></p>" * 3 + "</div>" * 10_000,
            id="10000-deep-article-with-links",
        ),
        pytest.param("<ul><li>" * 5_000 + "deep item" + "</li></ul>" * 5_000, id="5000-deep-lists"),
        pytest.param("<blockquote>" * 3_000 + "deep quote" + "</blockquote>" * 3_000, id="3000-deep-quotes"),
        pytest.param(
            f"<p title='{'x' * 1_000_000}'>big attribute</p>" + "<span>s</span>" * 10_000,
            id="1mb-attribute-and-10000-nodes",
        ),
    ],
)
@pytest.mark.slow  # seconds of CPU: left out of make test-fast
@pytest.mark.timeout(30)
def test_pathological_pages_finish_without_recursion_errors(html: str) -> None:
    # Speed belongs to bench/; the timeout only turns a quadratic blow-up into a named failure.
    result = html_to_markdown(html, PAGE_URL)
    assert isinstance(result, Extraction)
    assert result.markdown.strip()


@pytest.mark.skipif(not FIXTURE_PAGES.is_dir(), reason="shared fixture pages not present")
@pytest.mark.parametrize("name", ["wikipedia", "nytimes-1", "medium-1", "ars-1", "mozilla-1"])
def test_fixture_page_keeps_its_main_text(name: str) -> None:
    folder = FIXTURE_PAGES / name
    if not folder.is_dir():
        pytest.skip(f"fixture {name} missing")
    source = (folder / "source.html").read_text(encoding="utf-8", errors="replace")
    expected = (folder / "expected.html").read_text(encoding="utf-8", errors="replace")
    expected_words = set(" ".join(html_to_markdown(expected, PAGE_URL).markdown.split()[3:]).split())
    markdown = html_to_markdown(source, PAGE_URL).markdown
    found = set(markdown.split())
    assert len(expected_words & found) / max(1, len(expected_words)) > 0.8


def test_first_heading_repeating_the_title_is_not_written_twice() -> None:
    html = "<html><head><title>Pinned sockets</title></head><body><article><h1>Pinned sockets</h1>" + (
        "<p>The gateway connects only to the address it vetted, never to another one.</p></article></body></html>"
    )
    markdown = html_to_markdown(html, PAGE_URL).markdown
    assert markdown.count("Pinned sockets") == 1
    assert markdown.startswith("# Pinned sockets\n")


def test_chinese_article_outscores_a_latin_box_of_longer_character_count() -> None:
    # Twenty Han characters are a sentence; counted as raw characters they fell under the
    # paragraph minimum and the article got no votes at all.
    sentence = "研究人员表示、新电脑可以自学。"
    notice = "<div class='box'>" + "".join(f"<p>{FILLER}</p>" for _ in range(2)) + "</div>"
    story = "<div class='wrap'>" + "".join(f"<p>{sentence}{i}</p>" for i in range(8)) + "</div>"
    markdown = body_of(page(f"{notice}{story}"))
    assert sentence in markdown


def test_widget_word_on_a_wrapper_holding_the_article_does_not_drop_it() -> None:
    # The Independent wraps its body text in `gigya-share-btns-2_gig_containerParent`.
    captions = "<ul class='legends'>" + "".join(f"<li><p>CAPTION {i}: {FILLER}</p></li>" for i in range(12)) + "</ul>"
    wrapper = f"<div id='gigya-share-container' class='text-wrapper'>{''.join(f'<p>{FILLER}</p>' for _ in range(4))}"
    markdown = body_of(page(f"<article>{wrapper}{captions}</div></article>"))
    assert "council met" in markdown
    assert "CAPTION" not in markdown


def test_small_share_bar_is_still_removed() -> None:
    markdown = body_of(article("<div id='share-buttons'><a href='/t'>SECRET tweet</a> <a href='/f'>post</a></div>"))
    assert "SECRET" not in markdown


@pytest.mark.parametrize(
    ("math", "expected"),
    [
        pytest.param("<math><mi>a</mi><mo>≠</mo><mn>0</mn></math>", "a ≠ 0", id="inline-tokens-spaced"),
        pytest.param(
            "<math display='block'><msup><mi>x</mi><mn>2</mn></msup></math>", "\n\nx 2\n\n", id="block-own-paragraph"
        ),
        pytest.param(
            "<math><semantics><mi>y</mi><annotation encoding='application/x-tex'>TEXY</annotation></semantics></math>",
            "y",
            id="annotation-not-repeated",
        ),
    ],
)
def test_mathml_formulas_are_written_as_their_tokens(math: str, expected: str) -> None:
    markdown = body_of(article(f"<p>When {math} holds, the rest follows.</p>"))
    assert expected in markdown
    assert "TEXY" not in markdown


def test_conditional_cleaning_drops_link_lists_but_keeps_prose_with_links() -> None:
    links = "<div class='box'>" + "".join(f"<a href='/l{i}'>LINKLIST item {i}</a> " for i in range(10)) + "</div>"
    prose = f"<div class='box'><p>{FILLER} See <a href='/budget'>the budget</a>.</p></div>"
    markdown = body_of(article(f"{links}{prose}"))
    assert "LINKLIST" not in markdown
    assert "[the budget]" in markdown


def test_adjacent_lists_stay_separate_lists() -> None:
    # Lists were told apart by id() of their state, which the next list could reuse.
    markdown = body_of(article("<ul><li>a</li></ul><ul><li>b</li></ul><ol><li>c</li></ol><ol><li>d</li></ol>"))
    assert "- a\n\n- b\n\n1. c\n\n1. d" in markdown


@pytest.mark.parametrize(
    "html",
    [
        pytest.param(
            "<div><p>one, <a href=x> two </a></p><div><p>three <a href=y>four</a></p></div>five</div>",
            id="nested-candidates",
        ),
        pytest.param("<div><div> </div>\n<p>  x  </p> <span></span></div>", id="blank-text-nodes"),
        pytest.param("<div><div></div><section><p>x</p></section></div>", id="empty-element"),
        pytest.param("<div><a href=x><div><p>block link</p></div></a><p>after</p></div>", id="link-around-blocks"),
        pytest.param("<div><!-- note --><div>text<!-- c --></div> tail </div>", id="comments"),
        pytest.param("<div><p>中文\uff0c测试</p><div><a href=x>链接</a> </div></div>", id="cjk"),
    ],
)
def test_shared_measure_matches_a_direct_text_walk_of_each_candidate(html: str) -> None:
    tree = LexborHTMLParser(html)
    candidates = tree.css("div, section, p")
    stats = TextStats()
    # Measured in two rounds, so that cached and fresh nodes meet in one assembly.
    stats.measure(candidates[1:])
    stats.measure(candidates)
    for node in candidates:
        linked = sum(len(anchor.text(deep=True, strip=True)) for anchor in node.css("a"))
        assert (stats.text_chars[node.mem_id], stats.link_chars[node.mem_id]) == (text_length(node), linked)


@pytest.mark.parametrize(
    ("html", "holds"),
    [
        pytest.param("<div>" + f"<p>{FILLER}</p>" * 5 + "</div>", True, id="long-article"),
        pytest.param(f"<div><p>{FILLER}</p></div>", False, id="short-article"),
        pytest.param("<div>" + "<p> \n\t </p>" * 2_000 + f"<p>{FILLER * 4}</p></div>", False, id="blank-prefix"),
    ],
)
def test_quick_article_length_check_never_overstates(html: str, holds: bool) -> None:
    nodes = LexborHTMLParser(html).css("body > div")
    assert surely_holds(nodes, 500) is holds
    if holds:
        assert sum(text_length(node) for node in nodes) >= 500


def test_aria_hidden_false_with_a_border_none_style_is_kept() -> None:
    html = (
        "<html><body><article><p>Visible introduction paragraph with enough words to count.</p>"
        '<p aria-hidden="false" style="border: none">Kept paragraph that a reader does see on the page.</p>'
        "</article></body></html>"
    )
    assert "Kept paragraph" in html_to_markdown(html, PAGE_URL).markdown
