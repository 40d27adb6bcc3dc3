"""robots.txt per RFC 9309: parsing, longest-match rules, and a per-origin cache.

Fetched through the same guarded client as the page itself. A 4xx robots.txt allows
everything; a 5xx or an unreachable one disallows everything (RFC 9309 section 2.3.1).
The file is hostile input: patterns are matched by splitting at `*` and finding each literal
piece leftmost in turn, linear in the path, never through a regex built from the file (a
`/*a*a*a*...b` pattern backtracks exponentially there), and parsing keeps a bounded number of
bounded rules. A refusal names the path, never the query (it reaches the audit log).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import unquote

from gateway.errors import ErrorCode, GatewayError

PRODUCT_TOKEN = "egress-gateway"  # noqa: S105 - RFC 9309 product token, not a secret
MAX_ROBOTS_BYTES = 500 * 1024  # RFC 9309 2.5: parse at least 500 KiB
MAX_CACHED_ORIGINS = 2048
# Google's parser stops at 500 KiB too; a group of more rules than this is not written by a person.
MAX_RULES_PER_GROUP = 10_000
MAX_PATTERN_CHARS = 2_048


@dataclass(frozen=True, slots=True)
class RobotsRule:
    allow: bool
    pattern: str

    def matches(self, path: str) -> bool:
        return pattern_matches(self.pattern, path)


@dataclass(frozen=True, slots=True)
class RobotsPolicy:
    rules: tuple[RobotsRule, ...]
    disallow_all_reason: str | None = None

    def verdict(self, path: str) -> RobotsRule | None:
        """The deciding Disallow rule for `path`, or None when allowed (longest match, allow wins ties)."""
        if self.disallow_all_reason is not None:
            return RobotsRule(False, "/")
        best: RobotsRule | None = None
        for rule in self.rules:
            if not rule.matches(path):
                continue
            if (
                best is None
                or len(rule.pattern) > len(best.pattern)
                or (len(rule.pattern) == len(best.pattern) and rule.allow)
            ):
                best = rule
        return best if best is not None and not best.allow else None


def pattern_matches(pattern: str, path: str) -> bool:
    """RFC 9309 2.2.3: `*` is any run of characters, a final `$` anchors the end; else a prefix.

    Leftmost matching of each literal piece is exact for `*`-only globs: a later piece can only
    gain from an earlier one ending as soon as possible. Each `find` starts where the last match
    ended and no piece is searched twice, so the work is linear in the path per piece.
    """
    anchored = pattern.endswith("$")
    pieces = (pattern[:-1] if anchored else pattern).split("*")
    first = pieces[0]
    if not path.startswith(first):
        return False
    if len(pieces) == 1:
        return not anchored or len(path) == len(first)
    position = len(first)
    middle, last = pieces[1:-1], pieces[-1]
    for piece in middle:
        if not piece:
            continue
        found = path.find(piece, position)
        if found < 0:
            return False
        position = found + len(piece)
    if anchored:
        return len(path) - len(last) >= position and path.endswith(last)
    return not last or path.find(last, position) >= 0


def parse_robots(text: str, agent: str = PRODUCT_TOKEN) -> RobotsPolicy:
    """Rules of the group naming our product token, else of the `*` group."""
    groups: dict[str, list[RobotsRule]] = {}
    current_agents: list[str] = []
    in_rules = False
    for raw_line in text.splitlines():
        line = raw_line.split("#", 1)[0].strip()
        if ":" not in line:
            continue
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if key == "user-agent":
            if in_rules:
                current_agents, in_rules = [], False
            current_agents.append(value.lower())
            for name in current_agents:
                groups.setdefault(name, [])
        elif key in ("allow", "disallow") and current_agents:
            in_rules = True
            if not value or len(value) > MAX_PATTERN_CHARS:
                continue  # an empty Disallow allows everything; an endless one is not a rule
            rule = RobotsRule(key == "allow", unquote(value))
            for name in current_agents:
                if len(groups[name]) < MAX_RULES_PER_GROUP:
                    groups[name].append(rule)
    chosen = groups.get(agent.lower(), groups.get("*", []))
    return RobotsPolicy(tuple(chosen))


RobotsFetcher = Callable[[str], Awaitable[tuple[int, bytes] | None]]


class RobotsCache:
    """robots.txt per origin, each cached for the `ttl_s` in force when it was fetched.

    `fetcher` returns (status, body), or None when robots.txt is unreachable.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, RobotsPolicy]] = OrderedDict()

    async def policy_for(self, origin: str, fetcher: RobotsFetcher, *, ttl_s: float) -> RobotsPolicy:
        entry = self._entries.get(origin)
        if entry is not None and entry[0] > self._clock():
            return entry[1]
        answer = await fetcher(origin + "/robots.txt")
        if answer is None:
            policy = RobotsPolicy((), "robots.txt unreachable")
        else:
            status, body = answer
            if 200 <= status < 300:
                policy = parse_robots(body[:MAX_ROBOTS_BYTES].decode("utf-8", errors="replace"))
            elif 400 <= status < 500:
                policy = RobotsPolicy(())
            else:
                policy = RobotsPolicy((), f"robots.txt answered {status}")
        self._entries[origin] = (self._clock() + ttl_s, policy)
        self._entries.move_to_end(origin)
        while len(self._entries) > MAX_CACHED_ORIGINS:
            self._entries.popitem(last=False)
        return policy

    async def check(self, origin: str, path: str, fetcher: RobotsFetcher, *, ttl_s: float) -> None:
        policy = await self.policy_for(origin, fetcher, ttl_s=ttl_s)
        # Rules were percent-decoded when parsed; decode the path the same way (RFC 9309 2.2.2)
        # so `Disallow: /~user` also stops `/%7Euser`.
        rule = policy.verdict(unquote(path))
        if rule is not None:
            why = policy.disallow_all_reason or f"rule 'Disallow: {rule.pattern}'"
            # The query stays out: it may carry what the agent searched for or a token.
            shown = path.split("?", 1)[0][:200]
            raise GatewayError(ErrorCode.ROBOTS_DISALLOWED, f"robots.txt of {origin} disallows {shown} ({why})")
