"""robots.txt per RFC 9309: groups, longest match, allow wins ties, wildcards, `$`, and the cache."""

from __future__ import annotations

import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.robots import MAX_PATTERN_CHARS, MAX_RULES_PER_GROUP, RobotsCache, parse_robots, pattern_matches

GROUPS = """
User-agent: *
Disallow: /private

User-agent: egress-gateway
User-agent: other-bot
Disallow: /only-for-us
Allow: /only-for-us/open

User-agent: unrelated
Disallow: /
"""


def disallowed(text: str, path: str, agent: str = "egress-gateway") -> str | None:
    rule = parse_robots(text, agent).verdict(path)
    return None if rule is None else rule.pattern


@pytest.mark.parametrize(
    ("agent", "path", "expected"),
    [
        pytest.param("egress-gateway", "/only-for-us/page", "/only-for-us", id="our-group-applies"),
        pytest.param("egress-gateway", "/private", None, id="star-group-ignored-when-ours-exists"),
        pytest.param("Egress-Gateway", "/only-for-us", "/only-for-us", id="agent-match-ignores-case"),
        pytest.param("other-bot", "/only-for-us", "/only-for-us", id="group-with-two-agents"),
        pytest.param("someone-else", "/private/x", "/private", id="star-group-for-unknown-agent"),
        pytest.param("someone-else", "/only-for-us", None, id="other-groups-do-not-leak"),
        pytest.param("egress-gateway", "/only-for-us/open/page", None, id="longer-allow-wins"),
    ],
)
def test_groups_are_chosen_by_product_token(agent: str, path: str, expected: str | None) -> None:
    assert disallowed(GROUPS, path, agent) == expected


@pytest.mark.parametrize(
    ("rules", "path", "expected"),
    [
        pytest.param("Disallow: /a\nAllow: /a/b", "/a/b/c", None, id="longest-match-allow"),
        pytest.param("Allow: /a\nDisallow: /a/b", "/a/b/c", "/a/b", id="longest-match-disallow"),
        pytest.param("Disallow: /page\nAllow: /page", "/page", None, id="allow-wins-a-tie"),
        pytest.param("Allow: /page\nDisallow: /page", "/page", None, id="allow-wins-a-tie-either-order"),
        pytest.param("Disallow: /*.pdf", "/docs/file.pdf", "/*.pdf", id="wildcard-matches"),
        pytest.param("Disallow: /*.pdf", "/docs/file.html", None, id="wildcard-needs-the-rest"),
        pytest.param("Disallow: /*.pdf$", "/file.pdf?x=1", None, id="dollar-anchors-the-end"),
        pytest.param("Disallow: /*.pdf$", "/file.pdf", "/*.pdf$", id="dollar-matches-at-the-end"),
        pytest.param("Disallow: /search", "/search?q=1", "/search", id="prefix-covers-query"),
        pytest.param("Disallow: /search", "/Search", None, id="paths-are-case-sensitive"),
        pytest.param("Disallow:", "/anything", None, id="empty-disallow-allows-all"),
        pytest.param("Disallow: /", "/anything", "/", id="root-disallows-all"),
        pytest.param("Disallow: /%7Euser", "/~user/page", "/~user", id="percent-encoded-pattern"),
        pytest.param("Disallow: /a # comment", "/a/b", "/a", id="comment-stripped"),
        pytest.param("Disallow: /a.b+c", "/a.b+c", "/a.b+c", id="regex-characters-are-literal"),
        pytest.param("Disallow: /a.b", "/axb", None, id="dot-is-not-a-wildcard"),
    ],
)
def test_rule_matching(rules: str, path: str, expected: str | None) -> None:
    assert disallowed(f"User-agent: *\n{rules}\n", path) == expected


def test_rules_before_any_user_agent_are_ignored() -> None:
    assert disallowed("Disallow: /\nUser-agent: *\nDisallow: /x\n", "/page") is None


def test_no_rules_for_anyone_allows_everything() -> None:
    assert disallowed("", "/page") is None


class FakeRobots:
    def __init__(self, answer: tuple[int, bytes] | None) -> None:
        self.answer = answer
        self.asked: list[str] = []

    async def __call__(self, url: str) -> tuple[int, bytes] | None:
        self.asked.append(url)
        return self.answer


@pytest.mark.parametrize(
    ("answer", "refused"),
    [
        pytest.param((404, b""), False, id="4xx-allows-everything"),
        pytest.param((503, b""), True, id="5xx-disallows-everything"),
        pytest.param(None, True, id="unreachable-disallows-everything"),
        pytest.param((200, b"User-agent: *\nDisallow: /x\n"), False, id="2xx-rules-apply"),
    ],
)
async def test_robots_status_decides_per_rfc_9309(answer: tuple[int, bytes] | None, refused: bool) -> None:
    cache = RobotsCache()
    fetcher = FakeRobots(answer)
    if refused:
        with pytest.raises(GatewayError) as caught:
            await cache.check("https://docs.example.org", "/page", fetcher, ttl_s=3600)
        assert caught.value.code == ErrorCode.ROBOTS_DISALLOWED
    else:
        await cache.check("https://docs.example.org", "/page", fetcher, ttl_s=3600)
    assert fetcher.asked == ["https://docs.example.org/robots.txt"]


async def test_robots_is_cached_per_origin_until_the_ttl_passes() -> None:
    now = [0.0]
    cache = RobotsCache(clock=lambda: now[0])
    fetcher = FakeRobots((200, b"User-agent: *\nDisallow: /x\n"))
    await cache.check("https://a.example", "/page", fetcher, ttl_s=3600)
    await cache.check("https://a.example", "/other", fetcher, ttl_s=3600)
    await cache.check("https://b.example", "/page", fetcher, ttl_s=3600)
    assert fetcher.asked == ["https://a.example/robots.txt", "https://b.example/robots.txt"]
    now[0] = 3601.0
    await cache.check("https://a.example", "/page", fetcher, ttl_s=3600)
    assert fetcher.asked[-1] == "https://a.example/robots.txt"
    assert len(fetcher.asked) == 3


async def test_disallowed_message_names_the_rule() -> None:
    cache = RobotsCache()
    with pytest.raises(GatewayError, match=r"Disallow: /x"):
        await cache.check("https://a.example", "/x/y", FakeRobots((200, b"User-agent: *\nDisallow: /x\n")), ttl_s=3600)


async def test_percent_encoded_path_matches_a_decoded_rule() -> None:
    cache = RobotsCache()
    robots = FakeRobots((200, b"User-agent: *\nDisallow: /~user\n"))
    with pytest.raises(GatewayError) as caught:
        await cache.check("https://a.example", "/%7Euser/page", robots, ttl_s=3600)
    assert caught.value.code == ErrorCode.ROBOTS_DISALLOWED


# ---------------------------------------------------------------------------------------------
# Hostile robots.txt: linear matching, bounded parsing, no query in the refusal


def _reference_match(pattern: str, path: str) -> bool:
    """The regex translation RFC 9309 describes, for small inputs only."""
    import re  # noqa: PLC0415 - the reference lives only here

    anchored = pattern.endswith("$")
    body = pattern[:-1] if anchored else pattern
    regex = ".*".join(re.escape(part) for part in body.split("*")) + ("$" if anchored else "")
    return re.match(regex, path) is not None


@pytest.mark.parametrize(
    ("pattern", "path"),
    [
        pytest.param(pattern, path, id=f"{pattern}~{path}")
        for pattern in ["/", "/a", "/a*", "/*a", "/a*b", "/a*b$", "/*.php$", "/*a*a*b", "/a**b", "$", "/a$", "*", "*$"]
        for path in ["/", "/a", "/ab", "/aab", "/ba", "/x.php", "/x.php?y", "/aXaYb", "/abab", "/b"]
    ],
)
def test_pattern_matching_agrees_with_the_rfc_translation(pattern: str, path: str) -> None:
    assert pattern_matches(pattern, path) is _reference_match(pattern, path)


def test_a_backtracking_bomb_pattern_is_matched_in_linear_time() -> None:
    # As a regex, `/.*a.*a...b` against 20,000 a's without a b backtracks for longer than the
    # test's timeout; split-and-find answers at once.
    bomb = "/" + "*a" * 60 + "*b"
    policy = parse_robots(f"User-agent: *\nDisallow: {bomb}\n")
    assert policy.verdict("/" + "a" * 20_000) is None
    assert policy.verdict("/" + "a" * 20_000 + "b") is not None


def test_parsing_keeps_a_bounded_number_of_bounded_rules() -> None:
    lines = "".join(f"Disallow: /r{index}\n" for index in range(MAX_RULES_PER_GROUP + 500))
    endless = "Disallow: /" + "x" * (MAX_PATTERN_CHARS + 1) + "\n"
    policy = parse_robots("User-agent: *\n" + endless + lines)
    assert len(policy.rules) == MAX_RULES_PER_GROUP
    assert all(len(rule.pattern) <= MAX_PATTERN_CHARS for rule in policy.rules)


async def test_disallowed_message_never_carries_the_query() -> None:
    cache = RobotsCache()

    async def fetcher(url: str) -> tuple[int, bytes]:
        return 200, b"User-agent: *\nDisallow: /search\n"

    with pytest.raises(GatewayError) as caught:
        await cache.check("https://example.org", "/search?q=secret+plans&token=abc", fetcher, ttl_s=60)
    assert caught.value.code == ErrorCode.ROBOTS_DISALLOWED
    assert "/search" in caught.value.message
    assert "secret" not in caught.value.message
    assert "?" not in caught.value.message
