"""Parser bombs are refused before parsing, after one linear scan; real shapes pass.

Lexbor is quadratic in nesting depth and in one element's attribute count (issue 28: pages of
0.5-1.6 MB used the whole conversion deadline). The assertions are on outcomes and on the work
the scan did (tags it read), never on time.
"""

from __future__ import annotations

import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.extract.render import RenderLimits, render_page
from gateway.tools.extract.render_options import RenderOptions
from gateway.tools.extract.structure_guard import (
    MAX_ATTRIBUTES_PER_ELEMENT,
    MAX_NESTING_DEPTH,
    check_structure,
    measure,
)

LIMITS = RenderLimits(
    max_chars=2_000_000, convert_html=True, options=RenderOptions("markdown", "inline"), max_pdf_pages=1, pdf_time_s=1
)


def nested_divs(page_bytes: int) -> str:
    levels = page_bytes // len("<div></div>")
    return "<html><body>" + "<div>" * levels + "deep text" + "</div>" * levels + "</body></html>"


def many_attributes(count: int) -> str:
    return "<html><body><div " + " ".join(f'a{i}="v"' for i in range(count)) + "><p>text</p></div></body></html>"


def unclosed_divs(page_bytes: int) -> str:
    return "<html><body>" + "<div>text " * (page_bytes // len("<div>text ")) + "</body></html>"


BOMBS = {
    "nested-0.5MB": nested_divs(500_000),
    "nested-1.6MB": nested_divs(1_600_000),
    "unclosed-1MB": unclosed_divs(1_000_000),
    "self-closed-divs": "<html><body>" + "<div/>" * 100_000 + "</body></html>",
    "attributes-200k": many_attributes(200_000),
    "attributes-unquoted": "<p " + " ".join(f"a{i}=v" for i in range(100_000)) + ">x</p>",
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_parser_bomb_is_too_large_after_reading_a_bounded_number_of_tags(name: str) -> None:
    page = BOMBS[name]
    assert 400_000 < len(page) < 2_400_000
    with pytest.raises(GatewayError) as caught:
        check_structure(page)
    assert caught.value.code == ErrorCode.TOO_LARGE
    assert "parser bomb" in caught.value.message
    # The scan stops at the first cap passed: its work does not grow with the rest of the page.
    assert measure(page).tags_scanned <= MAX_NESTING_DEPTH + 3


@pytest.mark.parametrize("name", ["nested-1.6MB", "attributes-200k"])
def test_render_page_answers_too_large_at_once(name: str) -> None:
    page = render_page(BOMBS[name].encode(), "text/html", 200, {}, "https://bomb.example/", limits=LIMITS)
    assert page.refusal is not None
    assert page.refusal.code == ErrorCode.TOO_LARGE


def test_the_scan_reads_each_tag_once() -> None:
    # 200,000 sibling paragraphs (1.4 MB): every tag read once, none of them nesting.
    page = "<html><body>" + "<p class='x' id=y>para</p>" * 200_000 + "</body></html>"
    shape = measure(page)
    assert shape.tags_scanned == 2 + 2 * 200_000 + 2
    assert (shape.max_depth, shape.max_attributes) == (0, 2)


@pytest.mark.parametrize(
    ("page", "depth", "attributes"),
    [
        pytest.param("<div><div><span>x</span></div></div>", 3, 0, id="plain-nesting"),
        pytest.param("<ul><li>a<li>b<li>c</ul><p>x<p>y", 1, 0, id="implicitly-closed"),
        pytest.param("<br><img src=a.png alt='x y'><hr/>", 0, 2, id="void-elements"),
        pytest.param("<svg>" + "<path d='M 0 0 L 1 1'/>" * 5_000 + "</svg>", 1, 1, id="svg-self-closing"),
        pytest.param("<script>" + "<div>" * 5_000 + "</script><div></div>", 1, 0, id="script-raw-text"),
        pytest.param("<!--" + "<div>" * 5_000 + "--><div></div>", 1, 0, id="comment"),
        pytest.param('<a title="a > b" href=x>t</a>', 1, 2, id="quoted-greater-than"),
        pytest.param('<a b="never closed', 1, 1, id="unclosed-quote"),
    ],
)
def test_the_depth_and_attribute_estimates_follow_html_rules(page: str, depth: int, attributes: int) -> None:
    shape = measure(page)
    assert (shape.max_depth, shape.max_attributes) == (depth, attributes)


def test_caps_are_far_above_real_pages_and_at_the_cap_a_page_converts() -> None:
    at_the_cap = nested_divs(MAX_NESTING_DEPTH * len("<div></div>"))
    assert measure(at_the_cap).max_depth == MAX_NESTING_DEPTH
    page = render_page(at_the_cap.encode(), "text/html", 200, {}, "https://deep.example/", limits=LIMITS)
    assert page.refusal is None
    assert "deep text" in page.text
    assert check_structure(many_attributes(MAX_ATTRIBUTES_PER_ELEMENT)).max_attributes == MAX_ATTRIBUTES_PER_ELEMENT
