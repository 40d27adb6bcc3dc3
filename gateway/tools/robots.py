"""robots.txt per RFC 9309: parsing, longest-match rules, and a per-origin cache.

Fetched through the same guarded client as the page itself. A 4xx robots.txt allows
everything; a 5xx or an unreachable one disallows everything (RFC 9309 section 2.3.1).
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import unquote

from gateway.errors import ErrorCode, GatewayError

PRODUCT_TOKEN = "egress-gateway"  # noqa: S105 - RFC 9309 product token, not a secret
MAX_ROBOTS_BYTES = 500 * 1024  # RFC 9309 2.5: parse at least 500 KiB
MAX_CACHED_ORIGINS = 2048


@dataclass(frozen=True, slots=True)
class RobotsRule:
    allow: bool
    pattern: str

    def matches(self, path: str) -> bool:
        return _compile(self.pattern).match(path) is not None


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


_PATTERN_CACHE: dict[str, re.Pattern[str]] = {}


def _compile(pattern: str) -> re.Pattern[str]:
    compiled = _PATTERN_CACHE.get(pattern)
    if compiled is None:
        anchored = pattern.endswith("$")
        body = pattern[:-1] if anchored else pattern
        regex = ".*".join(re.escape(part) for part in body.split("*"))
        compiled = re.compile(regex + ("$" if anchored else ""))
        if len(_PATTERN_CACHE) < 4096:
            _PATTERN_CACHE[pattern] = compiled
    return compiled


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
            if not value:
                continue  # an empty Disallow allows everything
            for name in current_agents:
                groups[name].append(RobotsRule(key == "allow", unquote(value)))
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
            raise GatewayError(ErrorCode.ROBOTS_DISALLOWED, f"robots.txt of {origin} disallows {path[:200]} ({why})")
