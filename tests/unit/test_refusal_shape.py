"""The proxy's refusal as every client shows it (issue 29): the status line names the code and the
destination (its port only when not the request's default), and the body carries one readable
line as the top-level `error` and `message` beside the structured object."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.proxy.http1.heads import error_response, refusal_hint, refusal_subject


def _refused(destination: tuple[str, int] | None, code: ErrorCode = ErrorCode.POLICY_DENIED) -> GatewayError:
    error = GatewayError(code, "github.com is not in agent's allow_domains")
    error.destination = destination
    return error


@pytest.mark.parametrize(
    ("destination", "default_port", "subject"),
    [
        pytest.param(("github.com", 443), 443, "github.com", id="connect-default-port-left-out"),
        pytest.param(("github.com", 8443), 443, "github.com:8443", id="connect-other-port-named"),
        pytest.param(("example.org", 80), 80, "example.org", id="plain-http-default-port"),
        pytest.param(("example.org", 443), 80, "example.org:443", id="plain-http-to-443-named"),
        pytest.param(("2001:db8::1", 443), 443, "[2001:db8::1]", id="ipv6-literal-bracketed"),
        pytest.param(("2001:db8::1", 8443), 443, "[2001:db8::1]:8443", id="ipv6-literal-with-port"),
        pytest.param(("github.com", 443), None, "github.com:443", id="no-default-known"),
        pytest.param(None, 443, "", id="nothing-decided"),
    ],
)
def test_the_subject_names_the_host_and_the_port_when_not_the_default(
    destination: tuple[str, int] | None, default_port: int | None, subject: str
) -> None:
    assert refusal_subject(_refused(destination), default_port) == subject


def test_status_line_and_body_of_a_refusal() -> None:
    raw = error_response(_refused(("github.com", 443)), keep_alive=False, default_port=443)
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 403 Forbidden (egress: policy_denied github.com)"
    document = orjson.loads(body)
    assert isinstance(document["error"], str)
    assert document["error"] == document["message"]
    assert document["error"].startswith("policy_denied: github.com is not in agent's allow_domains (")
    assert document["egress"]["destination"] == "github.com"
    assert set(document["egress"]) == {"code", "message", "retryable", "hint", "destination"}


def test_a_refusal_without_a_destination_has_the_code_alone() -> None:
    raw = error_response(GatewayError(ErrorCode.INVALID_INPUT, "malformed"), keep_alive=False, default_port=80)
    assert raw.startswith(b"HTTP/1.1 400 Bad Request (egress: invalid_input)\r\n")
    assert "destination" not in orjson.loads(raw.split(b"\r\n\r\n", 1)[1])["egress"]


def test_the_dns_hint_follows_whether_the_failure_can_pass() -> None:
    nxdomain = GatewayError(ErrorCode.DNS_FAILURE, "DNS lookup for x.example failed: NXDOMAIN", permanent=True)
    servfail = GatewayError(ErrorCode.DNS_FAILURE, "DNS lookup for x.example failed: SERVFAIL")
    assert "check the host name" in refusal_hint(nxdomain)
    assert "retry later" in refusal_hint(servfail)
