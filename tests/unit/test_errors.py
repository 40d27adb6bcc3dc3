"""The error taxonomy: one status table for both listeners, a GatewayError that pickles, and its
JSON wire form for the extraction workers (every field kept, hostile input refused)."""

from __future__ import annotations

import pickle

import orjson
import pytest

from gateway.errors import HTTP_STATUS, MAX_MESSAGE_CHARS, ErrorCode, GatewayError, Surface, status_for

PROXY_ONLY = {
    ErrorCode.AUTH_REQUIRED: (401, 407),
    ErrorCode.UNSAFE_URL: (400, 403),
    ErrorCode.BLOCKED_DESTINATION: (403, 403),
    ErrorCode.POLICY_DENIED: (403, 403),
}


@pytest.mark.parametrize("code", list(ErrorCode), ids=[str(c) for c in ErrorCode])
def test_every_code_has_a_status_on_each_surface(code: ErrorCode) -> None:
    api, proxy = PROXY_ONLY.get(code, (HTTP_STATUS[code], HTTP_STATUS[code]))
    assert status_for(code, "api") == api
    assert status_for(code, "proxy") == proxy


@pytest.mark.parametrize("surface", ["api", "proxy"])
def test_an_explicit_status_wins_on_both_surfaces(surface: Surface) -> None:
    error = GatewayError(ErrorCode.TOO_LARGE, "the request head is too large", status=431)
    assert error.status_on(surface) == 431


def test_gateway_error_survives_pickling_with_every_field() -> None:
    error = GatewayError(
        ErrorCode.CONNECT_FAILURE, "origin failed", status=None, retry_after_s=2.5, extra={"n": 1}, permanent=True
    )
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, GatewayError)
    assert copy.code is ErrorCode.CONNECT_FAILURE
    assert (copy.message, copy.retry_after_s, copy.extra, copy.permanent) == ("origin failed", 2.5, {"n": 1}, True)
    assert copy.to_body() == error.to_body()
    assert str(copy) == str(error)


def test_a_code_given_as_text_becomes_the_enum() -> None:
    assert GatewayError("timeout", "x").code is ErrorCode.TIMEOUT  # type: ignore[arg-type]


@pytest.mark.parametrize(("surface", "status"), [("api", 401), ("proxy", 407)])
def test_a_credential_refusal_is_the_surfaces_own_challenge_whatever_status_was_set(
    surface: Surface, status: int
) -> None:
    assert GatewayError(ErrorCode.AUTH_REQUIRED, "no credential", status=401).status_on(surface) == status


def test_gateway_error_crosses_a_process_boundary_as_plain_json_with_every_field() -> None:
    error = GatewayError(
        ErrorCode.UPSTREAM_STATUS, "origin answered 503", status=502, retry_after_s=1.5, extra={"status": 503},
        permanent=True,
    )  # fmt: skip
    copy = GatewayError.from_wire(orjson.loads(orjson.dumps(error.to_wire())))
    assert copy.code is ErrorCode.UPSTREAM_STATUS
    assert (copy.message, copy.status_override, copy.retry_after_s, copy.extra, copy.permanent) == (
        "origin answered 503", 502, 1.5, {"status": 503}, True,
    )  # fmt: skip
    assert copy.to_body() == error.to_body()


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"code": "no_such_code"}, id="unknown-code"),
        pytest.param({"status": 99}, id="status-below-range"),
        pytest.param({"status": "502"}, id="status-as-text"),
        pytest.param({"status": True}, id="status-as-bool"),
        pytest.param({"retry_after_s": -1}, id="negative-retry-after"),
        pytest.param({"extra": ["status"]}, id="extra-not-an-object"),
        pytest.param({"permanent": "yes"}, id="permanent-not-a-bool"),
    ],
)
def test_a_malformed_wire_error_is_refused(change: dict[str, object]) -> None:
    wire = GatewayError(ErrorCode.TOO_LARGE, "too big").to_wire() | change
    with pytest.raises((ValueError, TypeError)):
        GatewayError.from_wire(wire)


def test_a_wire_error_cannot_shadow_the_body_fields_or_smuggle_structures() -> None:
    wire = GatewayError(ErrorCode.TOO_LARGE, "too big").to_wire()
    wire["extra"] = {"code": "ok", "message": "fine", "retryable": True, "nested": {"a": 1}, "page": "x", "n": 2}
    body = GatewayError.from_wire(wire).to_body()["error"]
    assert (body["code"], body["message"], body["retryable"]) == ("too_large", "too big", False)
    assert body["page"] == "x"
    assert body["n"] == 2
    assert "nested" not in body


def test_a_wire_message_is_still_one_bounded_line() -> None:
    wire = GatewayError(ErrorCode.TOO_LARGE, "x").to_wire() | {"message": "line one\nline two " + "y" * 2_000}
    message = GatewayError.from_wire(wire).message
    assert "\n" not in message
    assert len(message) <= MAX_MESSAGE_CHARS
