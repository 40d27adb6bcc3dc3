"""Main-content rules for pages nobody tuned for: leads, boilerplate recognised by shape and words.

Each case is a small page written for it; the rules are general (structure, link share, class
words, phrases), so each page is built the way many sites build theirs.
"""

from __future__ import annotations

from gateway.tools.extract.markdown import html_to_markdown

PAGE_URL = "https://news.example.org/story"
FILLER = (
    "The council met on Tuesday to debate the budget, which has grown every year since the "
    "bridge opened, and members argued late into the evening about roads, schools and parks."
)
BODY = "".join(f"<p>{FILLER} Part {n}.</p>" for n in range(5))
LEAD = "The standfirst sums the story up in one sentence, as the lead of a news article does."


def render(html: str) -> str:
    return html_to_markdown(html, PAGE_URL).markdown


def page(inner: str) -> str:
    return f"<html><head><title>Story</title></head><body>{inner}</body></html>"


def test_a_lead_written_straight_into_a_div_beside_the_body_is_kept() -> None:
    html = page(f"<div class='story'><h2>Budget</h2><div class='deck'>{LEAD}</div><div class='text'>{BODY}</div></div>")
    markdown = render(html)
    assert LEAD in markdown
    assert markdown.index(LEAD) < markdown.index("council met")


def nested(inner: str, levels: int) -> str:
    """`inner` wrapped in `levels` divs, each with an image beside it (so none is an only child)."""
    for _ in range(levels):
        inner = f"<div><img src='/i.png' alt=''>{inner}</div>"
    return inner


def test_a_lead_several_levels_above_the_body_is_kept_while_the_wrapper_holds_little_else() -> None:
    html = page(f"<main><div><p>{LEAD}</p>{nested(f'<div>{BODY}</div>', 3)}</div></main>")
    assert LEAD in render(html)


def test_the_lead_search_stops_where_the_wrapper_holds_the_rest_of_the_page() -> None:
    notice = "Our offices are closed on public holidays, and replies may take a little longer then."
    others = "".join(f"<li><a href='/s{n}'>Another story number {n} from the archive</a></li>" for n in range(60))
    html = page(f"<main><div><p>{notice}</p><div><ul>{others}</ul></div>{nested(f'<div>{BODY}</div>', 3)}</div></main>")
    markdown = render(html)
    assert "council met" in markdown
    assert notice not in markdown


def test_an_author_box_or_a_caption_beside_the_body_is_not_taken_as_its_lead() -> None:
    bio = "Jane Doe leads the politics desk. She studied history and writes about cities and money."
    caption = "The bridge at dusk, seen from the old harbour wall on the north bank. Foto: J. Doe"
    html = page(
        f"<article><div class='author-box'><p>{bio}</p></div><div class='pic'><p>{caption}</p></div>"
        f"<div class='text'>{BODY}</div></article>"
    )
    markdown = render(html)
    assert "Jane Doe leads" not in markdown
    assert "harbour wall" not in markdown
    assert "council met" in markdown


def test_a_caption_that_credits_its_picture_is_dropped_and_a_plain_one_kept() -> None:
    credited = "The harbour at dawn, before the ferries leave (Foto: J. Doe)"
    agency = "Ministers arrive for the vote in the capital. REUTERS/Jane Roe"
    plain = "The old harbour wall at dawn"
    figures = "".join(
        f"<figure><img src='/{n}.jpg' alt=''><figcaption>{text}</figcaption></figure>"
        for n, text in enumerate((credited, agency, plain))
    )
    markdown = render(page(f"<article>{BODY}{figures}{BODY}</article>"))
    assert "ferries leave" not in markdown
    assert "Ministers arrive" not in markdown
    assert plain in markdown


def test_site_notices_named_by_their_class_are_dropped_inside_the_article() -> None:
    notices = (
        "<div class='editorial-disclaimer'><p>This article reflects the opinion of its author only.</p></div>"
        "<div class='licence-info'><p>Protected by copyright; reuse needs written permission.</p></div>"
        "<div class='star-rating'>Rate this article: 4 of 5</div>"
    )
    markdown = render(page(f"<article>{BODY}{notices}</article>"))
    assert "council met" in markdown
    for words in ("opinion of its author", "written permission", "Rate this article"):
        assert words not in markdown


def test_teaser_cards_author_boxes_and_captions_inside_the_article_are_dropped_whatever_their_size() -> None:
    # Each box is long enough that scoring spared it (over 500 characters), yet under half the
    # article: inside the chosen content its class says what it is.
    long_bio = "Jane Doe writes about cities, budgets and bridges for the paper. " * 9
    long_teaser = "Another story about the harbour and its ferries, told at length. " * 9
    boxes = (
        f"<div class='author-bio'><p>{long_bio}</p></div>"
        f"<div class='teaser-card'><p>{long_teaser}</p></div>"
        f"<div class='image-caption'><p>{long_teaser.replace('Another', 'A photo')}</p></div>"
    )
    markdown = render(page(f"<article>{BODY}{BODY}{boxes}{BODY}</article>"))
    assert "council met" in markdown
    assert "Jane Doe writes" not in markdown
    assert "Another story" not in markdown
    assert "A photo story" not in markdown


def test_a_chrome_word_on_the_box_holding_most_of_the_article_does_not_drop_it() -> None:
    markdown = render(page(f"<article><div class='post-footer-wrap'>{BODY}{BODY}</div><p>{FILLER}</p></article>"))
    assert "Part 4" in markdown


def test_named_chrome_pruning_never_takes_more_than_half_of_the_article() -> None:
    # A listing page whose every entry is a "teaser" card: the cards are the page.
    cards = "".join(
        f"<div class='teaser'><h3>Entry {n}</h3><p>{FILLER} Entry {n} ends here.</p></div>" for n in range(8)
    )
    markdown = render(page(f"<main><div class='list'>{cards}</div></main>"))
    kept = sum(f"Entry {n} ends here" in markdown for n in range(8))
    assert kept >= 4


def test_image_alt_text_is_written_only_where_it_is_a_label_or_a_formula() -> None:
    images = (
        "<p><a href='/big.jpg'><img src='/s.jpg' alt='Thumbnail of the harbour'></a></p>"
        "<figure><img src='/f.jpg' alt='Ferries'><figcaption>The ferries at dawn</figcaption></figure>"
        "<p><img src='/l.jpg' alt='A long description of a picture of the old harbour wall at dawn'></p>"
        "<p><img src='/c.png' alt='Step 3'></p>"
        "<p><img src='/m.png' alt='{\\displaystyle x^{2}}'></p>"
    )
    markdown = render(page(f"<article>{BODY}{images}{BODY}</article>"))
    assert "Thumbnail" not in markdown
    assert "Ferries" not in markdown
    assert "long description" not in markdown
    assert "Step 3" in markdown
    assert "x^{2}" in markdown


def test_a_first_heading_repeating_the_title_without_the_site_name_is_not_written_twice() -> None:
    html = (
        "<html><head><title>Budget approved after a long night | The Daily Example</title></head><body>"
        f"<article><h1>Budget approved after a long night</h1>{BODY}<h2>News</h2><p>{FILLER}</p></article>"
        "</body></html>"
    )
    markdown = render(html)
    assert markdown.count("Budget approved after a long night") == 1
    assert markdown.startswith("# Budget approved after a long night | The Daily Example\n")
    assert "## News" in markdown


def test_a_noscript_holding_the_page_is_measured_without_the_scripts_inside_it() -> None:
    # A <noscript> with a long script inside and a line of text is a fallback notice, not the page.
    notice = "Please enable JavaScript to read this site."
    script = "<script>" + "var x = 1;" * 400 + "</script>"
    html = page(f"<noscript>{script}<p>{notice}</p></noscript><article>{BODY}</article>")
    assert notice not in render(html)
    # One holding the page's text is the page.
    assert "council met" in render(page(f"<noscript><article>{BODY * 3}</article></noscript>"))
