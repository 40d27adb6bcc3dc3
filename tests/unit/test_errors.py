"""The error taxonomy: one status table for both listeners, and a GatewayError that pickles."""

from __future__ import annotations

import pickle

import pytest

from gateway.errors import HTTP_STATUS, ErrorCode, GatewayError, Surface, status_for

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
