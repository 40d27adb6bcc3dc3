"""The outbound scanner as tables: each tier's rules, placement, streaming across chunk cuts,
decoding, and that findings never carry the matched text (issue 26)."""

from __future__ import annotations

import gzip
import zlib

import brotli
import pytest

from gateway.scan.exact import ExactNeedles
from gateway.scan.scanner import BODY, Finding, Scanner, high_entropy_offsets, shannon_bits

VALUE = b"realvalue-0123456789-abcdefghij"
PLACEHOLDER = "egph_AbCdEfGhIjKlMnOpQrStUvWxYz012345"
SHAPED = "ghp_egph" + "Q" * 32  # a shape-preserving placeholder: also GitHub-shaped

# Tokens made up for the table: they have the format's shape, nothing more.
TOKENS: list[tuple[str, str]] = [
    ("tier2.aws_access_key_id", "AKIAIOSFODNN7EXAMPLE"),
    ("tier2.github_token", "ghp_" + "a1B2c3D4e5" * 3 + "f6G7h8"),
    ("tier2.github_token", "gho_" + "Z" * 36),
    ("tier2.github_token", "ghs_" + "0" * 36),
    ("tier2.github_fine_grained_pat", "github_pat_" + "A1b2C3d4E5" * 8 + "_x"),
    ("tier2.slack_token", "xoxb-1234567890-abcdefghij"),
    ("tier2.openai_api_key", "sk-proj-" + "abcDEF123_" * 5),
    ("tier2.anthropic_api_key", "sk-ant-api03-" + "aB3-_" * 18),
    ("tier2.google_api_key", "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6q"),
    ("tier2.stripe_live_key", "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"),
    ("tier2.private_key_pem", "-----BEGIN RSA PRIVATE KEY-----"),
    ("tier2.private_key_pem", "-----BEGIN OPENSSH PRIVATE KEY-----"),
    ("tier2.private_key_pem", "-----BEGIN PRIVATE KEY-----"),
    ("tier3.jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"),
    ("tier3.gitlab_token", "glpat-" + "x" * 20),
    ("tier3.npm_token", "npm_" + "b" * 36),
    ("tier3.huggingface_token", "hf_" + "c" * 34),
    ("tier3.stripe_test_key", "sk_test_" + "d" * 24),
    ("tier3.aws_secret_access_key", "aws_secret_access_key = " + "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("tier3.url_credentials", "https://user:hunter22@example.com/"),
]
RULE_IDS = [f"{rule}-{i}" for i, (rule, _) in enumerate(TOKENS)]


def scanner(**tiers: bool) -> Scanner:
    return Scanner(ExactNeedles([("github", VALUE)], [("github", PLACEHOLDER), ("shaped", SHAPED)]), **tiers)


@pytest.mark.parametrize(("rule", "token"), TOKENS, ids=RULE_IDS)
def test_each_token_format_is_found_in_a_body_with_its_rule_and_offset(rule: str, token: str) -> None:
    body = b'{"note": "' + token.encode() + b'"}'
    findings = scanner().body(1 << 20).feed(body)
    assert [(f.rule, f.offset) for f in findings] == [(rule, 10)]


@pytest.mark.parametrize(
    "text",
    [
        "the quick brown fox jumps over the lazy dog",
        "AKIA is an AWS prefix",  # the prefix alone
        "ghp_short",
        "sk-proj-short",
        "commit 3f786850e387550fdab836ed7e6dc881de23001b",
        "id 123e4567-e89b-12d3-a456-426614174000",
        "-----BEGIN CERTIFICATE-----",
        "-----BEGIN PUBLIC KEY-----",
    ],
    ids=["prose", "bare-prefix", "short-ghp", "short-openai", "git-sha", "uuid", "certificate", "public-key"],
)
def test_ordinary_text_has_no_finding(text: str) -> None:
    assert scanner().scan_text(text, "url") == []


def test_tier_switches_turn_rules_off() -> None:
    body = b" AKIAIOSFODNN7EXAMPLE glpat-" + b"x" * 20
    assert {f.tier for f in scanner().body(1 << 20).feed(body)} == {2, 3}
    assert {f.tier for f in scanner(tier2=False).body(1 << 20).feed(body)} == {3}
    assert scanner(tier2=False, tier3=False).body(1 << 20).feed(body) == []


def test_held_values_and_placeholders_are_tier_one_and_name_the_credential() -> None:
    text = f"a={PLACEHOLDER}&b={VALUE.decode()}"
    findings = scanner().scan_text(text, "url")
    assert [(f.rule, f.credential, f.offset) for f in findings if f.tier == 1] == [
        ("tier1.placeholder", "github", 2),
        ("tier1.secret_value", "github", 5 + len(PLACEHOLDER)),
    ]


def test_a_shape_preserving_placeholder_is_not_also_a_github_token() -> None:
    findings = scanner().scan_text(f"token {SHAPED} end", "header")
    assert [(f.rule, f.credential) for f in findings] == [("tier1.placeholder", "shaped")]


@pytest.mark.parametrize("cut", [1, 3, 7, 13, 64, 1000], ids=lambda n: f"chunks-of-{n}")
def test_a_token_split_across_chunks_is_found_once_at_its_offset(cut: int) -> None:
    token = b"ghp_" + b"k" * 36
    body = b"x " * 700 + token + b" and " + VALUE + b" and " + PLACEHOLDER.encode() + b" end"
    scan = scanner().body(1 << 20)
    for start in range(0, len(body), cut):
        scan.feed(body[start : start + cut])
    assert sorted((f.rule, f.offset) for f in scan.findings) == sorted(
        [
            ("tier2.github_token", 1400),
            ("tier1.secret_value", body.index(VALUE)),
            ("tier1.placeholder", body.index(PLACEHOLDER.encode())),
        ]
    )


def test_findings_past_the_window_are_not_reported_and_the_scan_says_it_stopped() -> None:
    body = b"a " * 600 + b" AKIAIOSFODNN7EXAMPLE "
    scan = scanner().body(1000)
    scan.feed(body)
    assert scan.findings == []
    assert scan.truncated


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda data: zlib.compress(data)[2:-4]),  # raw deflate, as servers send it too
        ("br", brotli.compress),
    ],
    ids=["gzip", "deflate-zlib", "deflate-raw", "br"],
)
def test_compressed_bodies_are_decoded_before_scanning(encoding: str, encode: object) -> None:
    assert callable(encode)
    body = encode(b"padding " * 5000 + b'"AKIAIOSFODNN7EXAMPLE"')
    scan = scanner().body(1 << 20, encoding)
    for start in range(0, len(body), 97):
        scan.feed(body[start : start + 97])
    assert [(f.rule, f.offset) for f in scan.findings] == [("tier2.aws_access_key_id", 40001)]


def test_a_decompression_bomb_stops_at_the_window() -> None:
    bomb = gzip.compress(b"\0" * (64 << 20))
    scan = scanner().body(1 << 20, "gzip")
    scan.feed(bomb)
    assert scan.truncated
    assert scan.done_bytes <= 1 << 20


@pytest.mark.parametrize("encoding", ["gzip", "zstd"], ids=["corrupt-gzip", "unknown-encoding"])
def test_an_unreadable_body_is_a_tier_two_finding(encoding: str) -> None:
    scan = scanner().body(1 << 20, encoding)
    scan.feed(b"this is not gzip at all")
    assert [(f.rule, f.tier) for f in scan.findings] == [("scan.undecodable_body", 2)]


def test_findings_carry_no_matched_text() -> None:
    token = "AKIAIOSFODNN7EXAMPLE"
    findings = scanner().scan_text(f"k={token}&p={PLACEHOLDER}&v={VALUE.decode()}", "url")
    assert findings
    for finding in findings:
        rendered = repr(finding) + repr(finding.audit())
        assert token not in rendered
        assert PLACEHOLDER not in rendered
        assert VALUE.decode() not in rendered


def test_placeholders_in_dns_names_are_found_in_any_case_and_across_labels() -> None:
    lower = PLACEHOLDER.lower()
    name = f"{lower[:20]}.{lower[20:]}.attacker.example"
    assert scanner().scan_dns_name(name) == [Finding("tier1.placeholder", 1, "dns", credential="github")]
    assert scanner().scan_dns_name("www.example.org") == []


@pytest.mark.parametrize(
    ("url", "flagged"),
    [
        ("https://example.org/search?q=how+to+bake+bread", False),
        ("https://example.org/commit/3f786850e387550fdab836ed7e6dc881de23001b", False),
        ("https://example.org/x?d=Zq3xK9mP2vL8nR4tW7yB1cF6hJ0sD5gAe", True),
        ("https://example.org/Zq3xK9mP2vL8nR4tW7yB1cF6hJ0sD5gAeU/next", True),
    ],
    ids=["words", "git-sha", "random-query-value", "random-path-segment"],
)
def test_high_entropy_url_components(url: str, flagged: bool) -> None:
    assert bool(high_entropy_offsets(url.encode())) is flagged
    rules = [f.rule for f in scanner().scan_text(url, "url")]
    assert ("tier3.high_entropy_url" in rules) is flagged


def test_entropy_figures_match_the_research_notes() -> None:
    assert shannon_bits("0123456789abcdef" * 2) == pytest.approx(4.0)
    assert shannon_bits("aaaa") == 0


def test_body_offsets_are_relative_to_the_decoded_body() -> None:
    scan = scanner().body(1 << 20)
    scan.feed(b"0123456789")
    scan.feed(b" AKIAIOSFODNN7EXAMPLE")
    assert [(f.where, f.offset) for f in scan.findings] == [(BODY, 11)]
