"""The token formats the outbound scanner knows, as RE2 patterns, and their compiled sets.

Tier 2 is high-confidence prefixed formats (a match is almost surely a live credential): blocked
by default. Tier 3 is a broader set with more false positives: reported by default. The tiers in
use are compiled into ONE RE2 alternation with a capture group per rule, so a body is read once
and the group that matched names the rule (and its tier). RE2 runs in time linear in the input whatever the
pattern or the input (Python's `re` backtracks and never runs on a request body here).

Every pattern's match is bounded (`MAX_TOKEN_BYTES`), which is what lets a streaming scan keep
only that many bytes of overlap between chunks and still find a token split across them.
Never sees a policy, a credential value or a socket.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import re2

# The longest match any rule can produce; the streaming overlap is this long.
MAX_TOKEN_BYTES = 512


@dataclass(frozen=True, slots=True)
class TokenRule:
    rule_id: str  # stable, in audit lines and docs: `tier2.github_token`
    pattern: str  # RE2 syntax, no capture groups of its own


TIER2_RULES: tuple[TokenRule, ...] = (
    TokenRule("tier2.aws_access_key_id", r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b"),
    TokenRule("tier2.github_token", r"\bgh[pousr]_[A-Za-z0-9]{36}\b"),
    TokenRule("tier2.github_fine_grained_pat", r"\bgithub_pat_[A-Za-z0-9_]{82}\b"),
    TokenRule("tier2.slack_token", r"\bxox[abposr]-[A-Za-z0-9-]{10,200}"),
    TokenRule("tier2.anthropic_api_key", r"\bsk-ant-(?:api|admin)[0-9]{2}-[A-Za-z0-9_-]{80,120}"),
    TokenRule(
        "tier2.openai_api_key",
        r"\bsk-(?:proj|svcacct|admin)-[A-Za-z0-9_-]{20,250}|\bsk-[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}\b",
    ),
    TokenRule("tier2.google_api_key", r"\bAIza[0-9A-Za-z_-]{35}"),
    TokenRule("tier2.stripe_live_key", r"\b(?:sk|rk)_live_[0-9A-Za-z]{24,99}"),
    TokenRule("tier2.private_key_pem", r"-----BEGIN (?:[A-Z0-9]{1,10} ){0,2}PRIVATE KEY-----"),
)

TIER3_RULES: tuple[TokenRule, ...] = (
    TokenRule("tier3.jwt", r"\beyJ[A-Za-z0-9_-]{10,200}\.eyJ[A-Za-z0-9_-]{10,200}\.[A-Za-z0-9_-]{10,100}"),
    TokenRule("tier3.gitlab_token", r"\bglpat-[A-Za-z0-9_-]{20,50}"),
    TokenRule("tier3.npm_token", r"\bnpm_[A-Za-z0-9]{36}\b"),
    TokenRule("tier3.pypi_token", r"\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,300}"),
    TokenRule("tier3.huggingface_token", r"\bhf_[A-Za-z0-9]{34}\b"),
    TokenRule("tier3.sendgrid_key", r"\bSG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}\b"),
    TokenRule("tier3.stripe_test_key", r"\b(?:sk|rk)_test_[0-9A-Za-z]{24,99}"),
    TokenRule("tier3.slack_webhook", r"hooks\.slack\.com/services/T[A-Z0-9]{6,12}/B[A-Z0-9]{6,12}/[A-Za-z0-9]{24}"),
    TokenRule(
        "tier3.aws_secret_access_key",
        r"(?i)aws_?secret_?(?:access_?)?key[\"']?\s{0,4}[:=]\s{0,4}[\"']?[A-Za-z0-9/+=]{40}",
    ),
    TokenRule("tier3.url_credentials", r"\b[a-z][a-z0-9+.-]{1,15}://[^\s/:@]{1,64}:[^\s/:@]{3,128}@"),
    TokenRule(
        "tier3.generic_api_key",
        r"(?i)(?:api[_-]?key|secret|access[_-]?token|auth[_-]?token)[\"']?\s{0,4}[:=]\s{0,4}[\"']?[A-Za-z0-9_\-]{32,100}",
    ),
)


class CompiledRules:
    """Rules as one RE2 expression; `find` yields (rule id, tier, start, end) per match."""

    __slots__ = ("_ids", "_regex", "_tiers")

    def __init__(self, rules: tuple[tuple[int, TokenRule], ...]) -> None:
        self._ids = tuple(rule.rule_id for _, rule in rules)
        self._tiers = tuple(tier for tier, _ in rules)
        options = re2.Options()
        # Bytes are bytes: a body is not UTF-8, and Latin-1 reads every byte as one character.
        options.encoding = re2.Options.Encoding.LATIN1
        alternation = "|".join(f"({rule.pattern})" for _, rule in rules)
        self._regex = re2.compile(alternation.encode("latin-1"), options)

    def find(self, data: bytes) -> list[tuple[str, int, int, int]]:
        out: list[tuple[str, int, int, int]] = []
        for match in self._regex.finditer(data):
            index = match.lastindex
            if index is not None:
                out.append((self._ids[index - 1], self._tiers[index - 1], match.start(), match.end()))
        return out


def _rules(tier2: bool, tier3: bool) -> tuple[tuple[int, TokenRule], ...]:
    return tuple((2, rule) for rule in TIER2_RULES if tier2) + tuple((3, rule) for rule in TIER3_RULES if tier3)


# One compiled expression per combination of tiers switched on, built once at import: a request
# is read by one RE2 pass whatever its principal's settings (two passes cost nearly twice one).
COMPILED: Mapping[tuple[bool, bool], CompiledRules] = MappingProxyType(
    {
        (tier2, tier3): CompiledRules(_rules(tier2, tier3))
        for tier2, tier3 in ((True, True), (True, False), (False, True))
    }
)
