"""The handshake gate of a tunnel: the first ClientHello, and the second after a HelloRetryRequest."""

from __future__ import annotations

import pytest

from gateway.proxy.tls.hello_gate import (
    MAX_HELD_BYTES,
    GateState,
    HelloGate,
    ServerFlight,
    classify_server_flight,
)
from gateway.proxy.tls.sni import ClientHelloPeek, PeekStatus
from tests.harness.tls_records import CHANGE_CIPHER_SPEC, HRR, client_hello, server_hello

ALLOWED = "docs.example.org"


REAL_SERVER_HELLO = server_hello(b"\x11" * 32)


def only_allowed(peek: ClientHelloPeek) -> str | None:
    if peek.status is PeekStatus.COMPLETE and peek.server_name == ALLOWED:
        return None
    return f"not {ALLOWED}"


@pytest.mark.parametrize(
    ("flight", "kind"),
    [
        pytest.param(HRR, ServerFlight.RETRY, id="hello-retry-request"),
        pytest.param(REAL_SERVER_HELLO, ServerFlight.OTHER, id="server-hello"),
        pytest.param(b"\x15\x03\x03\x00\x02\x02\x28", ServerFlight.OTHER, id="alert"),
        pytest.param(b"SSH-2.0-x\r\n", ServerFlight.OTHER, id="not-tls"),
        pytest.param(HRR[:20], ServerFlight.NEED_MORE, id="partial"),
        pytest.param(b"", ServerFlight.NEED_MORE, id="nothing"),
    ],
)
def test_server_first_flight_is_classified(flight: bytes, kind: ServerFlight) -> None:
    assert classify_server_flight(flight) == kind


def test_first_hello_passes_and_later_bytes_wait_for_the_server() -> None:
    gate = HelloGate(only_allowed)
    hello = client_hello(ALLOWED)
    step = gate.from_client(hello + b"\x17\x03\x03\x00\x01x")
    assert step.to_upstream == hello
    assert gate.state is GateState.AWAIT_SERVER
    released = gate.from_server(REAL_SERVER_HELLO)
    assert released.to_upstream == b"\x17\x03\x03\x00\x01x"
    assert gate.open


def test_second_hello_after_a_retry_naming_another_host_is_refused() -> None:
    gate = HelloGate(only_allowed)
    assert gate.from_client(client_hello(ALLOWED)).refusal is None
    assert gate.from_server(HRR).to_upstream == b""
    step = gate.from_client(CHANGE_CIPHER_SPEC + client_hello("other.example.com"))
    assert step.refusal is not None
    assert "second ClientHello" in step.refusal
    assert step.to_upstream == b""


def test_second_hello_pipelined_before_the_retry_is_still_checked() -> None:
    gate = HelloGate(only_allowed)
    first = client_hello(ALLOWED)
    step = gate.from_client(first + client_hello("other.example.com"))
    assert step.to_upstream == first
    assert gate.from_server(HRR).refusal is not None


def test_second_hello_after_a_retry_naming_the_same_host_passes_whole() -> None:
    gate = HelloGate(only_allowed)
    gate.from_client(client_hello(ALLOWED))
    gate.from_server(HRR[:10])
    gate.from_server(HRR[10:])
    second = CHANGE_CIPHER_SPEC + client_hello(ALLOWED)
    assert gate.from_client(second[:3]).to_upstream == b""
    assert gate.from_client(second[3:]).to_upstream == second
    assert gate.open


def test_after_a_retry_anything_but_a_client_hello_is_refused() -> None:
    gate = HelloGate(only_allowed)
    gate.from_client(client_hello(ALLOWED))
    gate.from_server(HRR)
    assert gate.from_client(b"\x17\x03\x03\x00\x01x").refusal is not None


def test_two_hellos_in_one_record_are_malformed() -> None:
    first, second = client_hello(ALLOWED), client_hello(ALLOWED)
    merged_body = first[5:] + second[5:]
    record = b"\x16\x03\x01" + len(merged_body).to_bytes(2, "big") + merged_body
    assert HelloGate(only_allowed).from_client(record).refusal is not None


def test_held_bytes_past_the_bound_ask_the_owner_to_stop_reading() -> None:
    gate = HelloGate(only_allowed)
    gate.from_client(client_hello(ALLOWED))
    assert gate.from_client(b"\x17" * (MAX_HELD_BYTES + 1)).hold
