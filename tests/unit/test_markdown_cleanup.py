"""Cleaner markdown: wiki chrome, heading permalinks, definition lists, link styles and formats."""

from __future__ import annotations

import re

import pytest
from selectolax.lexbor import LexborHTMLParser

from gateway.tools.extract.markdown import Link, RenderOptions, html_to_markdown

PAGE_URL = "https://wiki.example.org/wiki/Bridge"
FILLER = (
    "The council met on Tuesday to debate the budget, which has grown every year since the "
    "bridge opened, and members argued late into the evening about roads, schools and parks."
)
WIKI_PAGE = f"""<html><head><title>Bridge</title></head><body><div id="content">
<h1>Bridge</h1>
<div id="toc" class="toc"><div class="toctitle"><h2>Contents</h2></div>
<ul><li><a href="#History">1 History</a></li><li><a href="#References">2 References</a></li></ul></div>
<h2><span class="mw-headline" id="History">History</span><span class="mw-editsection">
<span class="mw-editsection-bracket">[</span><a href="/w/index.php?title=Bridge&amp;action=edit&amp;section=1"
title="Edit section: History">edit</a><span class="mw-editsection-bracket">]</span></span></h2>
<p>{FILLER}<sup id="cite_ref-1" class="reference"><a href="#cite_note-1">[1]</a></sup> It joins
<a href="/wiki/Roads">the roads</a>.</p>
<div class="mw-heading mw-heading2"><h2 id="Design">Design</h2><span class="mw-editsection">[<a
href="/w/index.php?title=Bridge&amp;veaction=edit&amp;section=2">edit</a> | <a
href="/w/index.php?title=Bridge&amp;action=edit&amp;section=2">edit source</a>]</span></div>
<p>{FILLER}<sup class="reference"><a href="#cite_note-2">[2]</a></sup></p><p>{FILLER}</p>
<h2><span class="mw-headline" id="References">References</span></h2>
<div class="reflist"><ol class="references">
<li id="cite_note-1"><span class="mw-cite-backlink"><b><a href="#cite_ref-1">^</a></b></span>
<span class="reference-text">Smith, J. (2001). <a href="https://books.example.com/bridges">A history of
bridges</a>. Example Press.</span></li>
<li id="cite_note-2"><span class="mw-cite-backlink"><b><a href="#cite_ref-2">^</a></b></span>
<span class="reference-text">Jones, K. <a href="https://journal.example.com/1">Spans and decks</a>.</span></li>
</ol></div></div></body></html>"""


def render(html: str, **options: str) -> str:
    return html_to_markdown(html, PAGE_URL, options=RenderOptions(**options)).markdown  # type: ignore[arg-type]


def article(inner: str) -> str:
    body = f"<article><p>{FILLER}</p>{inner}<p>{FILLER}</p></article>"
    return f"<html><head><title>Story</title></head><body>{body}</body></html>"


def test_wiki_edit_links_and_their_brackets_are_dropped() -> None:
    markdown = render(WIKI_PAGE)
    assert "## History\n" in markdown
    assert "## Design\n" in markdown
    assert "edit" not in markdown
    assert "[]" not in markdown
    assert "action=" not in markdown


def test_empty_contents_heading_is_dropped() -> None:
    markdown = render(WIKI_PAGE)
    assert "Contents" not in markdown
    assert "1 History" not in markdown


def test_citation_marks_are_text_not_links() -> None:
    markdown = render(WIKI_PAGE)
    assert "parks.[1] It joins [the roads](https://wiki.example.org/wiki/Roads)." in markdown
    assert "cite_note" not in markdown
    assert "cite_ref" not in markdown


def test_reference_list_is_kept_as_a_section() -> None:
    markdown = render(WIKI_PAGE)
    references = markdown[markdown.index("## References") :]
    assert (
        "1. Smith, J. (2001). [A history of bridges](https://books.example.com/bridges). Example Press." in references
    )
    assert "2. Jones, K. [Spans and decks](https://journal.example.com/1)." in references
    assert "^" not in markdown


@pytest.mark.parametrize(
    "heading",
    [
        pytest.param(
            '<h2 id="setup">Setup<a class="headerlink" href="#setup" title="Permalink">¶</a></h2>', id="pilcrow"
        ),
        pytest.param('<h2 id="setup"><a href="#setup" aria-hidden="false">#</a> Setup</h2>', id="hash-before"),
        pytest.param('<h2 id="setup">Setup <a href="#setup">🔗</a></h2>', id="link-emoji"),
        pytest.param(f'<h2 id="setup">Setup <a href="{PAGE_URL}#setup">§</a></h2>', id="absolute-self-link"),
        pytest.param('<h2 id="setup"><a href="#setup">Setup</a></h2>', id="heading-text-linking-to-itself"),
    ],
)
def test_heading_permalinks_are_dropped(heading: str) -> None:
    markdown = render(article(heading))
    assert "\n## Setup\n" in markdown
    assert "#setup" not in markdown


def test_a_heading_linking_elsewhere_keeps_its_link() -> None:
    assert "## [Setup guide](https://wiki.example.org/guide)" in render(
        article('<h2><a href="/guide">Setup guide</a></h2>')
    )


def test_definition_lists_keep_their_terms_above_their_definitions() -> None:
    html = article("<dl><dt>Span</dt><dd>The distance between supports.</dd><dt>Deck</dt><dd>The road.</dd></dl>")
    assert "**Span**\n\nThe distance between supports.\n\n**Deck**\n\nThe road." in render(html)
    assert "Span\n\nThe distance between supports." in render(html, format="text")


def test_a_heading_with_content_below_is_kept_and_a_trailing_one_is_not() -> None:
    html = article("<h2>Kept</h2><h3>Inner</h3><p>Words.</p><h2>Trailing</h2>")
    markdown = render(html.replace(f"<p>{FILLER}</p></article>", "</article>"))
    assert "## Kept\n\n### Inner\n\nWords." in markdown
    assert "Trailing" not in markdown


def test_links_none_keeps_the_words_and_the_links_list() -> None:
    result = html_to_markdown(
        article("<p>See <a href='/a'>the annex</a>.</p>"), PAGE_URL, options=RenderOptions(links="none")
    )
    assert "See the annex." in result.markdown
    assert "](" not in result.markdown
    assert result.links == (Link("the annex", "https://wiki.example.org/a"),)


def test_links_references_number_urls_once_in_a_list_at_the_end() -> None:
    html = article("<p><a href='/a'>one</a>, <a href='/b'>two</a> and <a href='/a'>one again</a>.</p>")
    markdown = render(html, links="references")
    assert "[one][1], [two][2] and [one again][1]." in markdown
    assert markdown.rstrip().endswith("[1]: https://wiki.example.org/a\n[2]: https://wiki.example.org/b")


def test_links_references_stay_within_max_chars() -> None:
    html = article("".join(f"<p>{FILLER} <a href='/p{i}'>page {i}</a>.</p>" for i in range(50)))
    result = html_to_markdown(html, PAGE_URL, max_chars=2_000, options=RenderOptions(links="references"))
    assert len(result.markdown) <= 2_001
    assert result.source_truncated
    used = {int(n) for n in re.findall(r"\]\[(\d+)\]", result.markdown)}
    defined = {int(n) for n in re.findall(r"^\[(\d+)\]: ", result.markdown, re.M)}
    assert used == defined
    assert used


def test_text_format_has_no_markup() -> None:
    html = article(
        "<h2>Part</h2><ul><li>red</li></ul><p>Run <code>make</code> via <a href='/x'>the tool</a>.</p>"
        "<pre class='language-sh'>make test</pre><blockquote><p>Quoted.</p></blockquote>"
        "<table><tr><th>Name</th><th>Value</th></tr><tr><td>a|b</td><td>1</td></tr></table><hr>"
    )
    text = render(html, format="text")
    assert text.startswith("Story\n\n")
    assert "\nPart\n\n• red\n\nRun make via the tool.\n\nmake test\n\n  Quoted.\n\nName\tValue\na|b\t1" in text
    for markup in ("#", "](", "`", "---", "> ", "- "):
        assert markup not in text


def test_html_format_is_the_cleaned_article_with_absolute_links() -> None:
    html = article(
        "<h2 id='s' class='x' style='color:red'>Setup<a href='#s'>¶</a></h2><!-- note -->"
        "<p onclick='steal()'>See <a href='/a' class='btn'>the annex</a> <a href='javascript:x()'>here</a>"
        " <img src='pic.png' alt='A bridge' data-x='1'>.</p>"
    )
    result = html_to_markdown(html, PAGE_URL, options=RenderOptions(format="html"))
    assert "<h2>Setup</h2>" in result.markdown
    assert '<a href="https://wiki.example.org/a">the annex</a> <a>here</a>' in result.markdown
    assert '<img src="https://wiki.example.org/wiki/pic.png" alt="A bridge">' in result.markdown
    for gone in ("onclick", "class=", "style=", "note", "javascript:", "¶"):
        assert gone not in result.markdown
    assert result.links == (Link("the annex", "https://wiki.example.org/a"),)
    assert LexborHTMLParser(result.markdown).css_first("p") is not None


def test_html_format_is_cut_on_a_tag_boundary_at_max_chars() -> None:
    html = article("".join(f"<p>{FILLER} {i}</p>" for i in range(100)))
    result = html_to_markdown(html, PAGE_URL, max_chars=1_000, options=RenderOptions(format="html"))
    assert result.source_truncated
    assert len(result.markdown) <= 1_000
    assert result.markdown.rstrip().endswith(">")


@pytest.mark.parametrize(
    "boilerplate",
    [
        pytest.param("<h3>Read more</h3><ul><li><a href='/a'>BOILER one</a></li><li><a href='/b'>two</a></li></ul>",
                     id="teaser-heading-and-its-links"),
        pytest.param("<p>Lesen Sie auch: <a href='/x'>BOILER Die Brücke</a></p>", id="teaser-line-german"),
        pytest.param("<p>À lire aussi <a href='/x'>BOILER le pont</a></p>", id="teaser-line-french"),
        pytest.param("<div>Share <span>12</span></div><p>BOILER</p>".replace("<p>BOILER</p>", ""), id="share-button"),
        pytest.param("<p>BOILER: subscribe to our newsletter for the full story.</p>", id="call-to-subscribe"),
        pytest.param("<p>Aktualisiert am 12.03.2021 BOILER</p>", id="date-line"),
        pytest.param("<figcaption>Foto: BOILER Agentur</figcaption>", id="photo-credit"),
    ],
)  # fmt: skip
def test_short_boilerplate_blocks_inside_the_article_are_dropped(boilerplate: str) -> None:
    markdown = render(article(boilerplate))
    assert "BOILER" not in markdown
    assert "Share" not in markdown
    assert markdown.count("council met") == 2


def test_a_long_paragraph_about_newsletters_is_kept() -> None:
    prose = f"<p>The newsletter, which readers subscribe to by post, {FILLER}</p>"
    assert "The newsletter, which readers subscribe" in render(article(prose))


def test_teaser_heading_keeps_the_prose_after_it() -> None:
    html = article(f"<h2>Related questions</h2><p>{FILLER.replace('council', 'assembly')}</p>")
    assert "assembly met" in render(html)


def test_text_written_straight_into_a_div_beside_an_image_box_is_found() -> None:
    story = "<br><br>".join(f"{FILLER} Part {i}." for i in range(6))
    footer = "<div class='box'><p>Copyright 2022 Example Media Group, all rights reserved.</p></div>"
    html = f"<html><body><div><div><img src='a.png'></div>{story}</div>{footer}</body></html>"
    markdown = render(html)
    assert "Part 0." in markdown
    assert "Part 5." in markdown
    assert "Copyright" not in markdown


def test_a_chrome_word_on_the_wrapper_of_the_whole_article_does_not_drop_it() -> None:
    paragraphs = "".join(f"<p>{FILLER}</p>" for _ in range(5))
    html = f"<html><body><div class='above-footer'><article>{paragraphs}</article></div></body></html>"
    assert "council met" in render(html)


def test_ruby_readings_do_not_split_japanese_words() -> None:
    sentence = "<ruby>子<rt>こ</rt></ruby>どもへの<ruby>虐待<rt>ぎゃくたい</rt></ruby>をなくすための法律ができました。"
    markdown = render(article(f"<p>{sentence * 3}</p>"))
    assert "子どもへの虐待をなくすための法律ができました。" in markdown
    assert "ぎゃくたい" not in markdown


def test_the_lead_before_the_body_container_is_kept_in_order() -> None:
    lead = "The standfirst sums the story up in one sentence, as the lead of a news article does."
    body = "".join(f"<p>{FILLER}</p>" for _ in range(4))
    html = (
        "<html><body><article><header><h1>Budget</h1><p class='lead'>"
        f"{lead}</p><p><a href='/tag'>Politics</a></p></header><div class='body'>{body}</div></article></body></html>"
    )
    markdown = render(html)
    assert lead in markdown
    assert markdown.index(lead) < markdown.index("council met")
    assert "Politics" not in markdown
