"""Request rules as tables, without I/O (issue 25): presets, globs, deny precedence, dot segments
and encodings, query and header matchers, report mode, rule ids, loader errors with file:line,
`policy lint` warnings and `lint --diff` lines."""

from __future__ import annotations

import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.policy.inspect_decide import RequestFacts, decide_request, inspects_host
from gateway.policy.inspect_lint import describe_inspect_changes, lint_inspect
from gateway.policy.load import parse_policy
from gateway.policy.model import Policy
from gateway.policy.request_path import split_target
from gateway.policy.request_rules import PathGlob, wildcard_match
from tests.harness.invalid_policies import (
    POLICY_FIXTURES,
    ExpectedErrors,
    assert_first_error_at,
    assert_fixtures_are_expected,
    invalid_fixture_cases,
)

INVALID = POLICY_FIXTURES / "invalid_inspect"

POLICY = """\
version: 1
defaults:
  inspect:
    - host: gist.github.com
      access: full
      deny: [{id: no-gist-writes, methods: [POST, PATCH, PUT, DELETE]}]
principals:
  default:
    egress: {allow_domains: ["*"]}
    inspect:
      - host: api.github.com
        access: read-only
        allow:
          - {methods: [POST], paths: ["/repos/myorg/*/issues/*/comments"]}
          - {methods: [GET], paths: ["/search/**"], query: {q: "repo:myorg/*"}}
        deny:
          - {id: no-admin, paths: ["/admin/**"]}
      - host: github.com
        allow:
          - {id: git-refs, methods: [GET], paths: ["/**/info/refs"], query: {service: git-upload-pack}}
          - {id: git-fetch, methods: [POST], paths: ["/**/git-upload-pack"]}
        deny:
          - {id: git-push, paths: ["/**/git-receive-pack"]}
      - host: "*.example.org"
        ports: [443, 8443]
        mode: report
        access: read-only
      - host: plain.example.net
        allow:
          - {methods: [GET], headers: {Accept: "application/json*", X-Debug: false}}
"""


@pytest.fixture(scope="module")
def policy() -> Policy:
    return parse_policy(POLICY, "policy.yaml")


CASES = [
    # (id, host, port, tls, method, target, headers, verdict, rule)
    ("preset-get", "api.github.com", 443, True, "GET", "/repos/x/y", (), "allow", "inspect[0].access"),
    ("preset-head", "api.github.com", 443, True, "HEAD", "/", (), "allow", "inspect[0].access"),
    ("preset-refuses-post", "api.github.com", 443, True, "POST", "/repos/x", (), "deny", "inspect[0].default_deny"),
    ("method-case-folded", "api.github.com", 443, True, "get", "/x", (), "allow", "inspect[0].access"),
    (
        "star-one-segment",
        "api.github.com",
        443,
        True,
        "POST",
        "/repos/myorg/r/issues/7/comments",
        (),
        "allow",
        "inspect[0].allow[0]",
    ),
    (
        "star-not-two-segments",
        "api.github.com",
        443,
        True,
        "POST",
        "/repos/myorg/r/x/issues/7/comments",
        (),
        "deny",
        "inspect[0].default_deny",
    ),
    (
        "anchored-no-suffix",
        "api.github.com",
        443,
        True,
        "POST",
        "/repos/myorg/r/issues/7/comments/9",
        (),
        "deny",
        "inspect[0].default_deny",
    ),
    ("deny-before-preset", "api.github.com", 443, True, "GET", "/admin/users", (), "deny", "no-admin"),
    ("deny-double-star-zero", "api.github.com", 443, True, "GET", "/admin", (), "deny", "no-admin"),
    ("encoded-letter-decoded", "api.github.com", 443, True, "GET", "/%61dmin/x", (), "deny", "no-admin"),
    ("dot-dot-refused", "api.github.com", 443, True, "GET", "/public/../admin", (), "deny", "inspect[0].path_check"),
    (
        "encoded-dot-dot",
        "api.github.com",
        443,
        True,
        "GET",
        "/public/%2e%2E/admin",
        (),
        "deny",
        "inspect[0].path_check",
    ),
    ("dot-refused", "api.github.com", 443, True, "GET", "/./admin", (), "deny", "inspect[0].path_check"),
    ("encoded-slash", "api.github.com", 443, True, "GET", "/public%2Fadmin", (), "deny", "inspect[0].path_check"),
    ("encoded-nul", "api.github.com", 443, True, "GET", "/a%00b", (), "deny", "inspect[0].path_check"),
    ("bad-percent", "api.github.com", 443, True, "GET", "/a%zz", (), "deny", "inspect[0].path_check"),
    ("truncated-percent", "api.github.com", 443, True, "GET", "/a%4", (), "deny", "inspect[0].path_check"),
    ("double-slash", "api.github.com", 443, True, "GET", "//admin", (), "deny", "inspect[0].path_check"),
    ("backslash", "api.github.com", 443, True, "GET", "/x\\..\\admin", (), "deny", "inspect[0].path_check"),
    (
        "query-glob",
        "api.github.com",
        443,
        True,
        "GET",
        "/search/code?q=repo:myorg/tools",
        (),
        "allow",
        "inspect[0].allow[1]",
    ),
    (
        "query-glob-miss-falls-to-preset",
        "api.github.com",
        443,
        True,
        "GET",
        "/search/code?q=x",
        (),
        "allow",
        "inspect[0].access",
    ),
    ("git-refs", "github.com", 443, True, "GET", "/o/r.git/info/refs?service=git-upload-pack", (), "allow", "git-refs"),
    (
        "git-refs-for-push",
        "github.com",
        443,
        True,
        "GET",
        "/o/r.git/info/refs?service=git-receive-pack",
        (),
        "deny",
        "inspect[1].default_deny",
    ),
    (
        "git-refs-second-service",
        "github.com",
        443,
        True,
        "GET",
        "/o/r/info/refs?service=git-upload-pack&service=git-receive-pack",
        (),
        "deny",
        "inspect[1].default_deny",
    ),
    ("git-fetch", "github.com", 443, True, "POST", "/o/r.git/git-upload-pack", (), "allow", "git-fetch"),
    ("git-push", "github.com", 443, True, "POST", "/o/r.git/git-receive-pack", (), "deny", "git-push"),
    ("git-other", "github.com", 443, True, "GET", "/o/r", (), "deny", "inspect[1].default_deny"),
    (
        "plain-http-on-80-judged-too",
        "github.com",
        80,
        False,
        "POST",
        "/o/r.git/git-receive-pack",
        (),
        "deny",
        "git-push",
    ),
    ("tls-on-80-not-inspected", "github.com", 80, True, "POST", "/x", (), "uninspected", None),
    ("other-port-not-inspected", "github.com", 8443, True, "POST", "/x", (), "uninspected", None),
    ("other-host", "docs.python.org", 443, True, "POST", "/x", (), "uninspected", None),
    ("defaults-entry", "gist.github.com", 443, True, "POST", "/", (), "deny", "no-gist-writes"),
    ("defaults-entry-get", "gist.github.com", 443, True, "GET", "/u/1", (), "allow", "defaults.inspect[0].access"),
    ("report-mode", "a.example.org", 8443, True, "POST", "/x", (), "would_deny", "inspect[2].default_deny"),
    ("glob-not-apex", "example.org", 443, True, "POST", "/x", (), "uninspected", None),
    (
        "header-glob",
        "plain.example.net",
        80,
        False,
        "GET",
        "/",
        (("accept", "application/json; q=1"),),
        "allow",
        "inspect[3].allow[0]",
    ),
    (
        "header-absent-test",
        "plain.example.net",
        80,
        False,
        "GET",
        "/",
        (("Accept", "application/json"), ("X-Debug", "1")),
        "deny",
        "inspect[3].default_deny",
    ),
    ("header-missing", "plain.example.net", 80, False, "GET", "/", (), "deny", "inspect[3].default_deny"),
    ("options-star", "api.github.com", 443, True, "OPTIONS", "*", (), "allow", "inspect[0].access"),
]


@pytest.mark.parametrize(
    ("host", "port", "tls", "method", "target", "headers", "verdict", "rule"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_request_rules_decide(
    policy: Policy,
    host: str,
    port: int,
    tls: bool,
    method: str,
    target: str,
    headers: tuple[tuple[str, str], ...],
    verdict: str,
    rule: str | None,
) -> None:
    principal = policy.principals["default"]
    result = decide_request(policy, principal, RequestFacts(host, port, tls, method, target, headers))
    assert (result.verdict, result.rule) == (verdict, rule)
    assert result.inspected == (verdict != "uninspected")
    if verdict in ("deny", "would_deny"):
        assert result.code in (ErrorCode.POLICY_DENIED, ErrorCode.UNSAFE_URL)


def test_refusal_names_the_rule_class_not_the_layout(policy: Policy) -> None:
    principal = policy.principals["default"]
    by_method = decide_request(policy, principal, RequestFacts("gist.github.com", 443, True, "POST", "/"))
    by_path = decide_request(policy, principal, RequestFacts("github.com", 443, True, "GET", "/o/r"))
    assert by_method.rule_class == "method"
    assert by_path.rule_class == "path"
    for verdict in (by_method, by_path):
        error = verdict.refusal()
        assert "no-gist" not in error.message
        assert "/**" not in error.message
        assert "inspect[" not in error.message
        assert error.rule == verdict.rule  # the audit line gets the id, the body does not


def test_query_path_is_audited_without_the_query(policy: Policy) -> None:
    principal = policy.principals["default"]
    result = decide_request(
        policy, principal, RequestFacts("github.com", 443, True, "GET", "/o/r/info/refs?service=git-upload-pack")
    )
    assert result.path == "/o/r/info/refs"


def test_inspects_only_named_hosts_and_ports(policy: Policy) -> None:
    principal = policy.principals["default"]
    assert inspects_host(policy, principal, "api.github.com", 443, tls=True)
    assert inspects_host(policy, principal, "api.github.com", 80, tls=False)
    assert not inspects_host(policy, principal, "api.github.com", 80, tls=True)
    assert inspects_host(policy, principal, "x.example.org", 8443, tls=True)
    assert not inspects_host(policy, principal, "pypi.org", 443, tls=True)


GLOBS = [
    ("/**", "/", True),
    ("/**", "/a/b/c", True),
    ("/a/**", "/a", True),
    ("/a/**", "/ab", False),
    ("/a/*", "/a/b", True),
    ("/a/*", "/a/b/c", False),
    ("/a/*", "/a/", True),
    ("/**/info/refs", "/info/refs", True),
    ("/**/info/refs", "/x/y.git/info/refs", True),
    ("/**/info/refs", "/x/info/refs/more", False),
    ("/a/**/z", "/a/z", True),
    ("/a/**/z", "/a/b/c/z", True),
    ("/v?/x", "/v1/x", True),
    ("/v?/x", "/v10/x", False),
    ("/*.json", "/a.json", True),
    ("/*.json", "/a/b.json", False),
]


@pytest.mark.parametrize(("glob", "path", "expected"), GLOBS, ids=[f"{g}~{p}" for g, p, _ in GLOBS])
def test_path_globs(glob: str, path: str, expected: bool) -> None:
    assert PathGlob.parse(glob).matches(split_target(path).segments) is expected


def test_wildcard_match_stays_fast_on_hostile_input() -> None:
    # A regex of several `.*` back-tracks exponentially here; the greedy walk does not.
    assert not wildcard_match("*a*a*a*a*a*a*a*b", "a" * 5000)
    glob = PathGlob.parse("/**/a/**/a/**/a/**/b")
    assert not glob.matches(split_target("/a" * 400).segments)


@pytest.mark.parametrize(
    "target",
    ["/%2e%2e/x", "/a/%2F/b", "/%5c", "/a%", "/%00", "/a//b", "/%ff", "x/y"],
    ids=[
        "encoded-dots",
        "encoded-slash",
        "encoded-backslash",
        "lone-percent",
        "nul",
        "empty-segment",
        "not-utf8",
        "relative",
    ],
)
def test_unsafe_paths_are_unsafe_url(target: str) -> None:
    with pytest.raises(GatewayError) as caught:
        split_target(target)
    assert caught.value.code == ErrorCode.UNSAFE_URL


def test_trailing_slash_and_query_parameters_split() -> None:
    path = split_target("/a/b/?x=1&x=2&flag&q=a+b%20c")
    assert path.segments == ("a", "b", "")
    assert path.query == {"x": ["1", "2"], "flag": [""], "q": ["a b c"]}


EXPECTED_ERRORS: ExpectedErrors = {
    "inline_double_star.yaml": (7, "'**' must be a whole segment"),
    "deny_only.yaml": (6, "needs access or allow rules"),
    "bad_access.yaml": (7, "access must be one of read-only, read-write, full"),
    "bad_method.yaml": (8, "'GET /' is not an HTTP method"),
    "relative_path.yaml": (9, "a path glob starts with '/'"),
    "dot_segment_glob.yaml": (7, "no '.' or '..' segment"),
    "duplicate_rule_id.yaml": (6, "two rules share one id"),
    "empty_rule.yaml": (7, "names nothing to match"),
    "no_host.yaml": (6, "needs a host"),
    "bad_header_name.yaml": (8, "'X Bad' is not a header name"),
}


def test_every_invalid_inspect_fixture_has_an_expected_message() -> None:
    assert_fixtures_are_expected(INVALID, EXPECTED_ERRORS)


@pytest.mark.parametrize(("name", "line", "message"), invalid_fixture_cases(EXPECTED_ERRORS))
def test_invalid_inspect_policy_fails_with_file_line(name: str, line: int, message: str) -> None:
    assert_first_error_at(INVALID / name, line, message)


LINTED = """\
version: 1
principals:
  default:
    inspect:
      - host: api.github.com
        allow:
          - {id: reads, methods: [GET], paths: ["/repos/**"]}
          - {id: narrower, methods: [GET], paths: ["/repos/myorg/*"]}
          - {id: blocked, methods: [DELETE], paths: ["/x/*"]}
          - {id: fine, methods: [POST], paths: ["/repos/myorg/*/issues"]}
        deny:
          - {id: no-delete, methods: [DELETE]}
          - {id: again, methods: [DELETE], paths: ["/y/**"]}
      - host: "*.github.com"
        access: read-only
      - host: uploads.github.com
        access: full
"""


def test_lint_reports_unreachable_and_shadowed_rules_with_their_line() -> None:
    warnings = lint_inspect(parse_policy(LINTED, "p.yaml"))
    assert warnings == [
        "p.yaml:8: warning: principals.default.inspect: rule narrower is shadowed by reads (it never decides)",
        "p.yaml:9: warning: principals.default.inspect: rule blocked is unreachable: no-delete denies all it allows",
        "p.yaml:13: warning: principals.default.inspect: rule again is shadowed by no-delete (it never decides)",
        "p.yaml:16: warning: principals.default.inspect: inspect[2] (uploads.github.com) is unreachable: inspect[1] "
        "(*.github.com) comes first and names every host and port it does",
    ]


def test_lint_is_quiet_on_a_clean_policy(policy: Policy) -> None:
    assert lint_inspect(policy) == []


def test_lint_diff_says_what_a_change_opens_and_closes_per_host_and_method(policy: Policy) -> None:
    changed = POLICY.replace('git-push, paths: ["/**/git-receive-pack"]', 'no-lfs, paths: ["/**/lfs/**"]').replace(
        "        access: read-only\n        allow:\n          - {methods: [POST]",
        "        access: read-write\n        allow:\n          - {methods: [POST]",
    )
    changed += "      - host: uploads.github.com\n        access: read-only\n"
    lines = describe_inspect_changes(policy, parse_policy(changed, "new.yaml"))
    assert "default: github.com POST opens /**/git-receive-pack (deny removed)" in lines
    assert "default: github.com PUT closes /**/lfs/** (deny added)" in lines
    assert "default: api.github.com DELETE opens /** (allow added)" in lines
    assert "default: uploads.github.com now inspected (requests judged by its rules, the rest closed)" in lines
    assert "default: uploads.github.com GET opens /** (allow added)" in lines
    assert all("gist" not in line for line in lines)
