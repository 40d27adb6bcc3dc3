"""Learn mode's pure part: hosts grouped by registrable domain, the lines that count, the review."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from gateway.errors import GatewayError
from gateway.policy.load import parse_policy
from gateway.policy.suggest import group_hosts, parse_audit_lines, parse_since, review_lines, suggest
from gateway.policy.suggest_inspect import path_globs


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        pytest.param(["pypi.org"], ["pypi.org"], id="one-apex"),
        pytest.param(["api.github.com"], ["api.github.com"], id="one-subdomain-stays-exact"),
        pytest.param(["api.github.com", "codeload.github.com"], ["*.github.com"], id="two-subdomains-glob"),
        pytest.param(
            ["github.com", "api.github.com", "raw.github.com"],
            ["github.com", "*.github.com"],
            id="apex-kept-beside-glob",
        ),
        pytest.param(["a.api.example.com", "b.api.example.com"], ["*.api.example.com"], id="deepest-common-parent"),
        pytest.param(["a.api.example.com", "www.example.com"], ["*.example.com"], id="parent-is-the-domain"),
        pytest.param(["a.github.io", "b.github.io"], ["a.github.io", "b.github.io"], id="private-suffix-not-merged"),
        pytest.param(
            ["one.s3.amazonaws.com", "two.s3.amazonaws.com"],
            ["one.s3.amazonaws.com", "two.s3.amazonaws.com"],
            id="bucket-names-not-merged",
        ),
        pytest.param(["www.bbc.co.uk", "news.bbc.co.uk"], ["*.bbc.co.uk"], id="two-label-suffix"),
        pytest.param(["a.co.uk", "b.co.uk"], ["a.co.uk", "b.co.uk"], id="registrable-domains-apart"),
        pytest.param(["203.0.113.7", "203.0.113.8"], ["203.0.113.7", "203.0.113.8"], id="ip-literals-exact"),
        pytest.param(["x.svc", "y.svc"], ["x.svc", "y.svc"], id="unknown-suffix-apex-each"),
        pytest.param(["pypi.org", "pypi.org"], ["pypi.org"], id="duplicates-once"),
    ],
)
def test_hosts_are_grouped_only_where_several_subdomains_of_one_domain_were_seen(
    hosts: list[str], expected: list[str]
) -> None:
    assert sorted(group_hosts(hosts)) == sorted(expected)


NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("30m", datetime(2026, 12, 2, 11, 30, tzinfo=UTC), id="minutes"),
        pytest.param("2h", datetime(2026, 12, 2, 10, 0, tzinfo=UTC), id="hours"),
        pytest.param("1d", datetime(2026, 12, 1, 12, 0, tzinfo=UTC), id="days"),
        pytest.param("2026-12-01T11:00:00Z", datetime(2026, 12, 1, 11, 0, tzinfo=UTC), id="rfc3339-z"),
        pytest.param("2026-12-01T11:00:00", datetime(2026, 12, 1, 11, 0, tzinfo=UTC), id="no-zone-is-utc"),
    ],
)
def test_since_is_a_time_or_an_age(text: str, expected: datetime) -> None:
    assert parse_since(text, NOW) == expected


@pytest.mark.parametrize("text", ["", "yesterday", "2x", "-5m", "12"])
def test_since_that_is_neither_is_a_typed_error(text: str) -> None:
    with pytest.raises(GatewayError, match="neither a time") as caught:
        parse_since(text, NOW)
    assert caught.value.code == "invalid_input"


def _line(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "time": "2026-12-01T11:00:00.000000Z",
        "schema": 1,
        "event": "decision",
        "kind": "connect",
        "principal": "agent",
        "port": 443,
        "decision": "allow",
        "rule": "allow_domains[0]",
    }
    return base | fields


def test_report_mode_lines_are_suggested_and_listed_while_denials_and_the_guard_are_only_listed() -> None:
    lines = [
        _line(host="pypi.org"),
        _line(host="files.pythonhosted.org", decision="would_deny", code="policy_denied", rule="default_deny"),
        _line(host="evil.example.net", decision="deny", code="policy_denied", rule="deny_domains[0]"),
        _line(
            event="repeated",
            host="evil.example.net",
            decision="deny",
            code="policy_denied",
            rule="deny_domains[0]",
            count=4,
        ),
        _line(
            host="metadata.example.org",
            decision="would_deny",
            code="blocked_destination",
            rule="builtin_ranges",
            rule_pattern="169.254.0.0/16",
        ),
        _line(host="typo.example.org", outcome="dns_error", code="dns_failure"),
        _line(kind="search", host=None, port=None, rule="tools.search"),
        _line(kind="fetch", host="docs.example.org", port=80, rule="allow_domains[1]"),
        _line(event="close", host="never.example.org"),
    ]
    result = suggest(lines)
    agent = result.document["principals"]["agent"]
    assert agent["egress"]["allow_domains"] == ["docs.example.org", "pypi.org", "files.pythonhosted.org"]
    assert agent["tools"] == {"search": True, "fetch": True}
    assert result.document["defaults"] == {"ports": [80, 443], "mode": "enforce"}
    assert [(r.host, r.count) for r in result.denied] == [("evil.example.net", 5)]
    assert [r.host for r in result.would_deny] == ["files.pythonhosted.org"]
    assert [(r.host, r.rule_pattern) for r in result.guarded] == [("metadata.example.org", "169.254.0.0/16")]
    assert [r.host for r in result.unresolved] == ["typo.example.org"]
    review = "\n".join(review_lines(result, "audit.log"))
    assert "internal_hosts" in review
    assert "evil.example.net:443  policy_denied  (deny_domains[0]; connect)  5 time(s)" in review
    # What it suggests is a policy the daemon loads.
    parse_policy(yaml.safe_dump(result.document))


def test_a_base_keeps_tokens_budgets_and_used_internal_hosts_and_enforces() -> None:
    token = "a" * 64
    base: dict[str, Any] = {
        "version": 1,
        "defaults": {"mode": "report", "ports": [443, 8443], "allow_cidrs": ["198.51.100.0/24"]},
        "principals": {
            "agent": {
                "token_sha256": token,
                "mode": "report",
                "egress": {
                    "allow_domains": ["*"],
                    "deny_domains": ["bad.example.net"],
                    "internal_hosts": [
                        {"host": "searxng.tools.svc.cluster.local", "cidrs": ["10.0.0.0/8"]},
                        {"host": "unused.tools.svc.cluster.local", "cidrs": ["10.0.0.0/8"]},
                    ],
                },
                "budgets": {"fetch": {"per_step": 3}},
            },
            "other": {"egress": {"allow_domains": ["example.org"]}},
        },
    }
    lines = [
        _line(host="pypi.org"),
        _line(kind="fetch", host="searxng.tools.svc.cluster.local", port=80, rule="internal_hosts[0]"),
    ]
    result = suggest(lines, base=base)
    agent = result.document["principals"]["agent"]
    assert agent["token_sha256"] == token
    assert agent["budgets"] == {"fetch": {"per_step": 3}}
    assert "mode" not in agent
    assert agent["egress"] == {
        "allow_domains": ["pypi.org"],
        "deny_domains": ["bad.example.net"],
        "internal_hosts": [{"host": "searxng.tools.svc.cluster.local", "cidrs": ["10.0.0.0/8"]}],
    }
    assert result.document["principals"]["other"] == base["principals"]["other"]
    assert result.document["defaults"] == {"mode": "enforce", "ports": [80, 443], "allow_cidrs": ["198.51.100.0/24"]}
    assert base["principals"]["agent"]["mode"] == "report"  # the base document is not changed


def test_one_principal_and_a_time_bound_select_the_lines() -> None:
    lines = [
        _line(host="old.example.org", time="2026-12-01T09:00:00.000000Z"),
        _line(host="new.example.org", time="2026-12-01T11:30:00.000000Z"),
        _line(host="theirs.example.org", principal="other", time="2026-12-01T11:30:00.000000Z"),
    ]
    result = suggest(lines, principal="agent", since=datetime(2026, 12, 1, 10, 0, tzinfo=UTC))
    assert result.principals == ("agent",)
    assert result.document["principals"]["agent"]["egress"]["allow_domains"] == ["new.example.org"]
    assert result.decisions == 1


def test_lines_that_are_not_audit_json_are_counted_not_fatal() -> None:
    entries, skipped = parse_audit_lines([b'{"event":"decision"}', b"{cut", b"[1]", b"", b'"text"'])
    assert (len(entries), skipped) == (1, 3)


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        pytest.param(["/simple/requests/"], ["/simple/requests/"], id="one-path-exact"),
        pytest.param(["/repos/o/a/issues", "/repos/o/b/pulls"], ["/repos/o/**"], id="common-prefix"),
        pytest.param(["/repos/o/a", "/search/code"], ["/repos/o/a", "/search/code"], id="different-first-segments"),
        pytest.param(["/a", "/a/b"], ["/a/**"], id="a-path-and-below"),
        pytest.param(["/x/**/y"], ["/x/**"], id="glob-syntax-in-a-path-stops-the-prefix"),
        pytest.param(["/x/../etc"], ["/x/**"], id="dot-segment-stops-the-prefix"),
        pytest.param(["/"], ["/"], id="root"),
        pytest.param(["relative"], [], id="not-a-path"),
    ],
)
def test_paths_become_the_smallest_globs_that_cover_them(paths: list[str], expected: list[str]) -> None:
    assert path_globs(paths) == expected


def test_inspected_hosts_get_methods_and_path_prefixes_and_unused_entries_stay() -> None:
    base: dict[str, Any] = {
        "version": 1,
        "defaults": {"ports": [80, 443], "inspect": [{"host": "shared.example.org", "access": "read-only"}]},
        "principals": {
            "agent": {
                "egress": {"allow_domains": ["*"]},
                "inspect": [
                    {
                        "host": "*.github.com",
                        "access": "read-write",
                        "deny": [{"id": "no-admin", "paths": ["/admin/**"]}],
                    },
                    {"host": "gist.example.net", "access": "full"},
                ],
            }
        },
    }
    lines = [
        _line(kind="http", host="api.github.com", port=80, method="GET", path="/repos/o/a/issues"),
        _line(kind="http", host="api.github.com", port=80, method="GET", path="/repos/o/b/pulls"),
        _line(kind="http", host="api.github.com", port=80, method="POST", path="/repos/o/a/issues"),
        _line(kind="http", host="shared.example.org", port=80, method="GET", path="/feed"),
        _line(
            kind="inspect", host="pkg.example.com", port=8443, method="get", path="/simple/x/", rule="inspect[2].access"
        ),
        _line(kind="http", host="plain.example.com", port=80, method="GET", path="/not-inspected"),
    ]
    result = suggest(lines, base=base)
    inspect = result.document["principals"]["agent"]["inspect"]
    assert inspect == [
        {
            "host": "*.github.com",
            "deny": [{"id": "no-admin", "paths": ["/admin/**"]}],
            "allow": [
                {"methods": ["GET"], "paths": ["/repos/o/**"]},
                {"methods": ["POST"], "paths": ["/repos/o/a/issues"]},
            ],
        },
        {"host": "gist.example.net", "access": "full"},
        {"host": "pkg.example.com", "allow": [{"methods": ["GET"], "paths": ["/simple/x/"]}], "ports": [8443]},
        {"host": "shared.example.org", "allow": [{"methods": ["GET"], "paths": ["/feed"]}], "ports": [80]},
    ]
    parse_policy(yaml.safe_dump(result.document))
