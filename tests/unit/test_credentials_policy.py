"""The `credentials:` and `scan:` policy sections, placeholders, bindings and the screening verdict
as tables without I/O (issue 26)."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from gateway.credentials.placeholders import placeholder_for
from gateway.credentials.screen import HELD_ONLY, RequestFacts, binding_holds, judge, path_matches
from gateway.credentials.store import HeldCredential, HeldSecrets
from gateway.errors import ErrorCode
from gateway.policy.load import PolicyError, parse_policy
from gateway.policy.model import (
    CredentialBinding,
    CredentialRule,
    Injection,
    PlaceholderShape,
    ScanSettings,
    SecretSource,
)
from gateway.scan.scanner import Finding

BASE = """\
version: 1
principals:
  default: {egress: {allow_domains: ["*"]}}
  agent: {token_sha256: "%s"}
""" % ("a" * 64)

GOOD = (
    BASE
    + """\
credentials:
  placeholder_key: {file: /run/secrets/placeholder-key}
  entries:
    - name: github
      source: {file: /run/secrets/github/token}
      inject: bearer
      placeholder: {prefix: ghp_, length: 40}
      bind:
        hosts: [api.github.com, "*.githubusercontent.com"]
        methods: [GET]
        paths: ["/repos/**"]
        principals: [agent]
      require: true
    - name: model
      source: {env: MODEL_KEY}
      inject: {header: X-Api-Key}
      bind: {hosts: [api.model.example], ports: [443, 8443]}
    - name: registry
      source: {env: REGISTRY_PASSWORD}
      inject: {basic: robot}
      bind: {hosts: [registry.example]}
"""
)


def test_a_complete_credentials_section_loads() -> None:
    policy = parse_policy(GOOD, "p.yaml")
    github, model, registry = policy.credentials.entries
    assert policy.credentials.placeholder_key == SecretSource("file", "/run/secrets/placeholder-key")
    assert github.inject == Injection("bearer")
    assert github.bind == CredentialBinding(
        ("api.github.com", "*.githubusercontent.com"), (443,), ("GET",), ("/repos/**",), ("agent",)
    )
    assert github.require
    assert github.shape == PlaceholderShape("ghp_", 40)
    assert model.inject == Injection("header", header="x-api-key")
    assert model.bind.ports == (443, 8443)
    assert registry.inject == Injection("basic", username="robot")
    assert (github.agent_variable, model.agent_variable) == ("GITHUB", "MODEL_KEY")


def _entry(body: str) -> str:
    return BASE + "credentials:\n  placeholder_key: {env: K}\n  entries:\n" + textwrap.indent(body, "    ")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            BASE
            + "credentials:\n  entries:\n"
            + "    - {name: a, source: {env: A}, inject: bearer, bind: {hosts: [a.example]}}\n",
            "p.yaml:6: credentials.placeholder_key is required when credentials are listed",
        ),
        (
            _entry("- {name: a, source: {env: A}, inject: bearer}\n"),
            "p.yaml:8: credentials.entries[0].bind is required",
        ),
        (
            _entry("- {name: a, source: {env: A}, inject: bearer, bind: {hosts: ['*']}}\n"),
            "p.yaml:8: credentials.entries[0].bind.hosts may not be '*'",
        ),
        (
            _entry("- {name: a, source: {env: A, file: /x}, inject: bearer, bind: {hosts: [a.example]}}\n"),
            "p.yaml:8: credentials.entries[0].source must name exactly one of env or file",
        ),
        (
            _entry("- {name: a, source: {file: relative}, inject: bearer, bind: {hosts: [a.example]}}\n"),
            "p.yaml:8: credentials.entries[0].source.file must be an absolute path",
        ),
        (
            _entry(
                "- {name: a, source: {env: A}, inject: {header: Proxy-Authorization}, bind: {hosts: [a.example]}}\n"
            ),
            "p.yaml:8: credentials.entries[0].inject.header: 'Proxy-Authorization' is not a header "
            "a credential may go into",
        ),
        (
            _entry("- {name: a, source: {env: A}, inject: digest, bind: {hosts: [a.example]}}\n"),
            "p.yaml:8: credentials.entries[0].inject must be bearer, {basic: USERNAME} or {header: NAME}",
        ),
        (
            _entry("- {name: a, source: {env: A}, inject: bearer, bind: {hosts: [a.example], principals: [nobody]}}\n"),
            "p.yaml:8: credentials.entries[0].bind.principals: no principal named 'nobody'",
        ),
        (
            _entry("- {name: a, source: {env: A}, inject: bearer, bind: {hosts: [a.example], paths: [repos]}}\n"),
            "p.yaml:8: credentials.entries[0].bind.paths: 'repos' is not a path glob starting with '/'",
        ),
        (
            _entry(
                "- {name: a, source: {env: A}, inject: bearer, bind: {hosts: [a.example]}, "
                "placeholder: {prefix: ghp_, length: 20}}\n"
            ),
            "p.yaml:8: credentials.entries[0].placeholder.length must be between 30 and 200, got 20",
        ),
        (
            _entry(
                "- {name: a, source: {env: A}, inject: bearer, bind: {hosts: [a.example]}}\n"
                "- {name: a, source: {env: B}, inject: bearer, bind: {hosts: [b.example]}}\n"
            ),
            "p.yaml:9: credentials.entries[1].name 'a' is given twice",
        ),
        (
            BASE.replace("default: {egress", "default: {scan: {tier2: block}, egress"),
            "p.yaml:3: principals.default.scan.tier2 must be one of deny, report, off, got 'block'",
        ),
        (
            BASE + "defaults:\n  scan: {body_window_bytes: 99999999999}\n",
            "p.yaml:6: defaults.scan.body_window_bytes must be between 0 and 16777216, got 99999999999",
        ),
    ],
    ids=[
        "no-placeholder-key",
        "no-binding",
        "bound-to-every-host",
        "two-sources",
        "relative-file",
        "proxy-authorization-header",
        "unknown-injection",
        "unknown-principal",
        "path-without-slash",
        "placeholder-too-short-to-be-unguessable",
        "duplicate-name",
        "unknown-tier-action",
        "window-too-large",
    ],
)
def test_invalid_sections_are_refused_with_file_and_line(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    assert message in caught.value.errors


def test_scan_sections_default_per_tier_and_accept_unquoted_off() -> None:
    text = BASE.replace("default: {egress", "default: {scan: {tier3: off}, egress") + "defaults:\n  scan: {}\n"
    policy = parse_policy(text, "p.yaml")
    assert policy.defaults.scan == ScanSettings()
    assert policy.principals["default"].scan == ScanSettings(tier3="off")
    assert policy.scan_for(policy.principals["agent"]) == ScanSettings()


KEY = b"k" * 32


def _rule(
    name: str = "github", shape: PlaceholderShape | None = None, bind: dict[str, Any] | None = None
) -> CredentialRule:
    binding = CredentialBinding(**{"hosts": ("api.github.com",), **(bind or {})})
    return CredentialRule(name, SecretSource("env", "X"), Injection("bearer"), binding, shape=shape)


def test_placeholders_are_stable_distinct_per_credential_and_key_and_shaped_when_asked() -> None:
    opaque = placeholder_for(KEY, _rule())
    assert opaque == placeholder_for(KEY, _rule())
    assert opaque.startswith("egph_")
    assert len(opaque) == 37
    assert opaque.isascii()
    assert opaque[5:].isalnum()
    assert opaque != placeholder_for(KEY, _rule("other"))
    assert opaque != placeholder_for(b"j" * 32, _rule())
    shaped = placeholder_for(KEY, _rule(shape=PlaceholderShape("ghp_", 40)))
    assert shaped.startswith("ghp_egph")
    assert len(shaped) == 40
    assert shaped[4:].isalnum()


@pytest.mark.parametrize(
    ("glob", "path", "matches"),
    [
        ("/repos/**", "/repos/org/name/issues", True),
        ("/repos/**", "/repos", True),
        ("/repos/*", "/repos/org", True),
        ("/repos/*", "/repos/org/name", False),
        ("/repos/*/issues", "/repos/org/issues", True),
        ("/repos/*/issues", "/repos/org/pulls", False),
        ("/v1/*.json", "/v1/data.json", True),
        ("/v1/*.json", "/v1/data.xml", False),
        ("/a/**/z", "/a/b/c/z", True),
        ("/a/**/z", "/a/z", True),
        ("/gists", "/gists/1", False),
    ],
    ids=[
        "double-star-deep",
        "double-star-zero",
        "star-one-segment",
        "star-not-two",
        "star-in-the-middle",
        "star-wrong-tail",
        "star-in-segment",
        "star-in-segment-miss",
        "double-star-middle",
        "double-star-middle-zero",
        "anchored",
    ],
)
def test_path_globs(glob: str, path: str, matches: bool) -> None:
    assert path_matches(glob, path) is matches


FACTS = RequestFacts("inspect", "agent", "https", "api.github.com", 443, "GET", "/repos/org/x")


@pytest.mark.parametrize(
    ("bind", "facts", "holds"),
    [
        ({}, FACTS, True),
        ({}, RequestFacts("http", "agent", "http", "api.github.com", 443, "GET", "/"), False),
        ({}, RequestFacts("inspect", "agent", "https", "evil.example", 443, "GET", "/"), False),
        ({}, RequestFacts("inspect", "agent", "https", "api.github.com", 8443, "GET", "/"), False),
        ({"principals": ("other",)}, FACTS, False),
        ({"methods": ("POST",)}, FACTS, False),
        ({"paths": ("/user/**",)}, FACTS, False),
        ({"hosts": ("*.github.com",)}, FACTS, True),
    ],
    ids=["inside", "plain-http", "other-host", "other-port", "principal-not-allowed", "method", "path", "glob-host"],
)
def test_binding(bind: dict[str, Any], facts: RequestFacts, holds: bool) -> None:
    assert binding_holds(_rule(bind=bind).bind, facts) is holds


def _held(**bind: Any) -> HeldSecrets:
    return HeldSecrets([HeldCredential(_rule(bind=bind), "egph_x" * 6, b"v" * 20)], 1)


PLACEHOLDER_SEEN = Finding("tier1.placeholder", 1, "header", "authorization", 7, "github")


def test_a_placeholder_inside_its_binding_is_no_finding_and_outside_is_misuse() -> None:
    assert judge([PLACEHOLDER_SEEN], _held(), FACTS, HELD_ONLY).clean
    outside = RequestFacts("http", "agent", "http", "paste.example", 80, "POST", "/")
    screening = judge([PLACEHOLDER_SEEN], _held(), outside, ScanSettings(tier1="off"))
    assert screening.refusal is not None
    assert screening.refusal.code == ErrorCode.CREDENTIAL_MISUSE
    assert screening.denied == [PLACEHOLDER_SEEN]
    not_allowed = judge([PLACEHOLDER_SEEN], _held(principals=("other",)), FACTS, HELD_ONLY)
    assert not_allowed.refusal is not None


@pytest.mark.parametrize(
    ("finding", "scan", "code", "reported"),
    [
        (Finding("tier2.github_token", 2, "body", offset=3), ScanSettings(), ErrorCode.SECRET_DETECTED, 0),
        (Finding("tier2.github_token", 2, "body", offset=3), ScanSettings(tier2="report"), None, 1),
        (Finding("tier2.github_token", 2, "body", offset=3), HELD_ONLY, None, 0),
        (Finding("tier3.jwt", 3, "url", offset=3), ScanSettings(), None, 1),
        (Finding("tier3.jwt", 3, "url", offset=3), ScanSettings(tier3="deny"), ErrorCode.SECRET_DETECTED, 0),
        (
            Finding("tier1.secret_value", 1, "query", offset=0, credential="github"),
            ScanSettings(),
            ErrorCode.CREDENTIAL_MISUSE,
            0,
        ),
        (
            Finding("tier1.secret_value", 1, "query", offset=0, credential="github"),
            ScanSettings(tier1="report"),
            None,
            1,
        ),
    ],
    ids=[
        "tier2-deny",
        "tier2-report",
        "tier2-off-without-scan",
        "tier3-report-by-default",
        "tier3-deny",
        "held-value-deny",
        "held-value-report",
    ],
)
def test_each_tier_follows_its_action(
    finding: Finding, scan: ScanSettings, code: ErrorCode | None, reported: int
) -> None:
    screening = judge([finding], _held(), FACTS, scan)
    assert (screening.refusal.code if screening.refusal else None) == code
    assert len(screening.reported) == reported
