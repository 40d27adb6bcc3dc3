"""The extraction workers' answers: a page or a real GatewayError, both through one JSON codec."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.extract.render import RenderedPage, RenderLimits, render_page

LIMITS = RenderLimits(max_chars=10_000)


def through_the_pipe(page: RenderedPage) -> RenderedPage:
    return RenderedPage.from_wire(orjson.loads(orjson.dumps(page.to_wire())))


def test_a_page_crosses_the_pipe_unchanged() -> None:
    page = RenderedPage("# T\n\ntext\n", "T", "text/html", (("a", "https://a.example/"),), source_truncated=True)
    assert through_the_pipe(page) == page


def test_a_refusal_crosses_the_pipe_as_a_gateway_error_with_its_fields() -> None:
    refusal = GatewayError(ErrorCode.TOO_LARGE, "the page has 900 pages", status=413, extra={"pages": 900})
    copy = through_the_pipe(RenderedPage(refusal=refusal)).refusal
    assert isinstance(copy, GatewayError)
    assert (copy.code, copy.message, copy.status_override, copy.extra) == (
        ErrorCode.TOO_LARGE, "the page has 900 pages", 413, {"pages": 900},
    )  # fmt: skip
    with pytest.raises(GatewayError) as raised:
        RenderedPage(refusal=copy).raise_refusal()
    assert raised.value is copy


def test_render_page_answers_a_binary_body_with_a_refusal_value_not_an_exception() -> None:
    page = render_page(b"\x89PNG\r\n\x1a\n" + bytes(64), "image/png", 200, {}, "https://a.example/", limits=LIMITS)
    assert page.refusal is not None
    assert page.refusal.code is ErrorCode.UNSUPPORTED_CONTENT
    assert through_the_pipe(page).refusal is not None


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"refusal": ["too_large", "the old (code, message) pair"]}, id="old-pair-form"),
        pytest.param({"refusal": {"code": "too_large"}}, id="refusal-missing-fields"),
        pytest.param({"refusal": {"code": "nope", "message": "", "status": None, "retry_after_s": None,
                                  "extra": {}, "permanent": False}}, id="unknown-code"),
        pytest.param({"links": [["only text"]]}, id="malformed-links"),
    ],
)  # fmt: skip
def test_a_malformed_answer_is_a_refusal_not_an_exception(change: dict[str, Any]) -> None:
    wire = RenderedPage("text").to_wire() | change
    refusal = RenderedPage.from_wire(wire).refusal
    assert refusal is not None
    assert (refusal.code, refusal.message) == (
        ErrorCode.UNSUPPORTED_CONTENT,
        "the converter returned a malformed answer",
    )
