"""Placeholder → real value on bound requests, real value → placeholder in their responses, as
tables over header field blocks and body chunks (issue 26)."""

from __future__ import annotations

import base64

import pytest

from gateway.credentials.inject import Scrubber, inject_credentials
from gateway.credentials.screen import RequestFacts
from gateway.credentials.store import HeldCredential, HeldSecrets
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.model import CredentialBinding, CredentialRule, Injection, SecretSource

PLACEHOLDER = "egph_" + "P" * 32
VALUE = b"real-" + b"V" * 30
FACTS = RequestFacts("inspect", "agent", "https", "api.example.org", 443, "GET", "/v1/x")


def held(inject: Injection, *, require: bool = False, value: bytes | None = VALUE) -> HeldSecrets:
    rule = CredentialRule(
        "api", SecretSource("env", "API"), inject, CredentialBinding(("api.example.org",)), require=require
    )
    return HeldSecrets([HeldCredential(rule, PLACEHOLDER, value)], 1)


def basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


@pytest.mark.parametrize(
    ("inject", "sent", "expected"),
    [
        (Injection("bearer"), b"\r\nAuthorization: Bearer " + PLACEHOLDER.encode(), b"Authorization: Bearer " + VALUE),
        (
            Injection("basic", username="robot"),
            b"\r\nAuthorization: " + basic("anyone", PLACEHOLDER),
            b"Authorization: " + basic("robot", VALUE.decode()),
        ),
        (
            Injection("header", header="x-api-key"),
            b"\r\nX-Api-Key: " + PLACEHOLDER.encode(),
            b"X-Api-Key: " + VALUE,
        ),
    ],
    ids=["bearer", "basic", "named-header"],
)
def test_the_placeholder_is_swapped_for_the_value(inject: Injection, sent: bytes, expected: bytes) -> None:
    fields = b"\r\nAccept: */*" + sent + b"\r\nX-Trace: 1"
    out, injected = inject_credentials(held(inject), FACTS, fields)
    assert out.split(b"\r\n")[1:] == [b"Accept: */*", b"X-Trace: 1", expected]
    assert [(i.credential, i.header) for i in injected] == [("api", inject.header)]
    assert PLACEHOLDER.encode() not in out


def test_a_second_client_sent_credential_header_is_removed_before_injecting() -> None:
    fields = b"\r\nAuthorization: Bearer agents-own-token\r\nAuthorization: Bearer " + PLACEHOLDER.encode()
    out, _ = inject_credentials(held(Injection("bearer")), FACTS, fields)
    assert out == b"\r\nAuthorization: Bearer " + VALUE


def test_a_request_without_the_placeholder_is_left_alone_unless_required() -> None:
    fields = b"\r\nAuthorization: Bearer agents-own-token"
    assert inject_credentials(held(Injection("bearer")), FACTS, fields) == (fields, [])
    with pytest.raises(GatewayError) as caught:
        inject_credentials(held(Injection("bearer"), require=True), FACTS, fields)
    assert caught.value.code == ErrorCode.POLICY_DENIED


def test_outside_the_binding_nothing_is_injected() -> None:
    fields = b"\r\nAuthorization: Bearer " + PLACEHOLDER.encode()
    elsewhere = RequestFacts("inspect", "agent", "https", "other.example.org", 443, "GET", "/")
    assert inject_credentials(held(Injection("bearer")), elsewhere, fields) == (fields, [])


def test_an_unreadable_value_refuses_without_naming_anything_secret() -> None:
    fields = b"\r\nAuthorization: Bearer " + PLACEHOLDER.encode()
    with pytest.raises(GatewayError) as caught:
        inject_credentials(held(Injection("bearer"), value=None), FACTS, fields)
    assert caught.value.code == ErrorCode.UNAVAILABLE
    assert PLACEHOLDER not in caught.value.message


def _credential(placeholder: str = PLACEHOLDER, value: bytes = VALUE) -> HeldCredential:
    rule = CredentialRule("api", SecretSource("env", "A"), Injection("bearer"), CredentialBinding(("a.example",)))
    return HeldCredential(rule, placeholder, value)


def test_scrubbing_reports_once_at_the_end_what_it_replaced() -> None:
    reports: list[int] = []
    scrubber = Scrubber([_credential()], 1 << 20, lambda done: reports.append(done.replaced))
    relayed = scrubber.body(b"HTTP/1.1 200 OK\r\nX-Echo: " + VALUE + b"\r\n\r\n" + VALUE)
    relayed += scrubber.finish()
    assert VALUE not in relayed
    assert len(relayed) == len(b"HTTP/1.1 200 OK\r\nX-Echo: \r\n\r\n") + 2 * len(VALUE)
    scrubber.finish()
    assert reports == [2]


@pytest.mark.parametrize("cut", [1, 5, 17, 4096], ids=lambda n: f"reads-of-{n}")
def test_scrubbing_a_body_split_anywhere_keeps_its_length(cut: int) -> None:
    same_length = "ghp_egph" + "Q" * (len(VALUE) - 8)
    scrubber = Scrubber([_credential(same_length)], 1 << 20)
    body = b'{"headers": {"Authorization": "Bearer ' + VALUE + b'"}, "again": "' + VALUE + b'"}'
    out = b"".join(scrubber.body(body[i : i + cut]) for i in range(0, len(body), cut)) + scrubber.finish()
    assert out == body.replace(VALUE, same_length.encode())
    assert scrubber.replaced == 2


def test_a_placeholder_of_another_length_is_cut_or_padded_to_the_values() -> None:
    longer = Scrubber([_credential("egph_" + "L" * 60)], 1 << 20)
    assert longer.body(b"<" + VALUE + b">") + longer.finish() == b"<" + b"egph_" + b"L" * (len(VALUE) - 5) + b">"
    shorter = Scrubber([_credential("egph_S")], 1 << 20)
    assert shorter.body(b"<" + VALUE + b">") + shorter.finish() == b"<egph_S" + b"*" * (len(VALUE) - 6) + b">"


def test_past_the_window_the_body_is_passed_as_it_is() -> None:
    scrubber = Scrubber([_credential()], 100)
    first = scrubber.body(b"a" * 150)
    later = scrubber.body(VALUE)
    assert first + later + scrubber.finish() == b"a" * 150 + VALUE
