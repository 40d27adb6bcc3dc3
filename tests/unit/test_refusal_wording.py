"""Refusals an agent can act on: `retryable` only when a retry can help, search failures that name
the host and the reason (and the settings that would add engines), TLS failures naming
EGRESS_CA_BUNDLE."""

from __future__ import annotations

import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.search.registry import engines_from_settings
from tests.harness.search_engines import BING, DDG, QUERY, ScriptedTransport, aggregator


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        pytest.param(GatewayError(ErrorCode.UPSTREAM_STATUS, "x answered 404", extra={"status": 404}), False, id="404"),
        pytest.param(GatewayError(ErrorCode.UPSTREAM_STATUS, "x answered 403", extra={"status": 403}), False, id="403"),
        pytest.param(GatewayError(ErrorCode.UPSTREAM_STATUS, "x answered 503", extra={"status": 503}), True, id="503"),
        pytest.param(GatewayError(ErrorCode.UPSTREAM_STATUS, "x answered 429", extra={"status": 429}), True, id="429"),
        pytest.param(
            # The I/O boundary marks a certificate failure permanent from its type (io_errors.py).
            GatewayError(ErrorCode.CONNECT_FAILURE, "TLS certificate for x rejected: self-signed", permanent=True),
            False,
            id="cert",
        ),
        pytest.param(GatewayError(ErrorCode.CONNECT_FAILURE, "connection to x:443 refused"), True, id="refused"),
        pytest.param(GatewayError(ErrorCode.POLICY_DENIED, "x is not allowed"), False, id="policy"),
        pytest.param(GatewayError(ErrorCode.AUDIT_UNAVAILABLE, "audit"), True, id="audit"),
    ],
)
def test_retryable_only_when_a_retry_can_help(error: GatewayError, retryable: bool) -> None:
    assert error.retryable is retryable
    assert error.to_body()["error"]["retryable"] is retryable


async def test_a_failed_search_names_host_and_reason_once_and_the_settings_that_add_engines() -> None:
    engines = engines_from_settings(["tavily", "duckduckgo", "bing"])
    transport = ScriptedTransport(
        {
            DDG: [GatewayError(ErrorCode.DNS_FAILURE, "https://html.duckduckgo.com/html/?q=secret: NXDOMAIN")],
            BING: [GatewayError(ErrorCode.TIMEOUT, "https://www.bing.com/search?q=secret timed out")],
        }
    )
    with pytest.raises(GatewayError) as caught:
        await aggregator(engines, transport).search(QUERY)
    message = caught.value.message
    assert "duckduckgo dns failure: html.duckduckgo.com did not resolve" in message
    assert "bing timeout: www.bing.com did not answer in time" in message
    assert "(dns_failure)" not in message
    assert "secret" not in message
    assert "skipped for want of a key: tavily" in message
    assert "EGRESS_SEARCH_TAVILY_KEY" in message
    assert "EGRESS_SEARCH_SEARXNG_URL" in message
