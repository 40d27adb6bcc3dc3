"""The one request decision: may this principal send this method, path, query and headers to
this inspected host? Pure and table-tested.

Every surface where a request is visible asks this function (inspected HTTPS, plain HTTP on the
forward proxy and the transparent listener, `web_fetch` before its first byte). Order: the
first `inspect` entry of the principal, then of `defaults`, whose host glob and port match; no
entry means the host is not inspected (today's behaviour). Within an entry: the path is
checked (`request_path.split_target`), deny rules first, then allow rules; a host with rules
is closed except for what they allow. `mode: report` turns a denial into `would_deny`.
Never does I/O, never reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from gateway.errors import ErrorCode, GatewayError
from gateway.policy.decide import glob_matches
from gateway.policy.model import Policy, Principal
from gateway.policy.request_path import RequestPath, split_target
from gateway.policy.request_rules import InspectEntry, RequestRule

Verdict = Literal["allow", "deny", "would_deny", "uninspected"]
# What a refusal body may say about why: the class of the rule, never its pattern or id.
RuleClass = Literal["method", "path", "query", "header", "url"]


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What the gateway knows of one request before it sends a byte of it upstream."""

    host: str  # the normalised host name the connection is pinned to
    port: int
    tls: bool
    method: str
    target: str  # origin-form `/path?query` (or `*`)
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class RequestVerdict:
    verdict: Verdict
    rule: str | None  # the rule id that decided (`inspect[0].allow[1]`), or None
    code: ErrorCode | None = None
    reason: str = ""
    rule_class: RuleClass | None = None
    path: str = ""  # the path without its query, for the audit line

    @property
    def allowed(self) -> bool:
        return self.verdict != "deny"

    @property
    def inspected(self) -> bool:
        return self.verdict != "uninspected"

    def refusal(self) -> GatewayError:
        """The error answered to the agent: the rule class, never the layout of the policy."""
        assert self.code is not None
        return GatewayError(self.code, self.reason, rule=self.rule)


def entries_for(policy: Policy, principal: Principal) -> Iterator[InspectEntry]:
    yield from principal.inspect
    yield from policy.defaults.inspect


def find_entry(policy: Policy, principal: Principal, host: str, port: int, *, tls: bool) -> InspectEntry | None:
    """The entry whose rules judge requests to host:port, or None when the host is not inspected."""
    for entry in entries_for(policy, principal):
        if glob_matches(entry.host, host) and entry.port_matches(port, tls=tls):
            return entry
    return None


def credential_bound(policy: Policy, host: str, port: int) -> bool:
    """Whether a credential is bound to host:port (issue 26): such a host is always inspected, so
    its placeholder can be swapped and its responses scrubbed."""
    return any(
        port in entry.bind.ports and any(glob_matches(glob, host) for glob in entry.bind.hosts)
        for entry in policy.credentials.entries
    )


def inspects_host(policy: Policy, principal: Principal, host: str, port: int, *, tls: bool) -> bool:
    """Whether connections to host:port are terminated (TLS) or judged per request (plain)."""
    if tls and credential_bound(policy, host, port):
        return True
    return find_entry(policy, principal, host, port, tls=tls) is not None


def _lower_headers(headers: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, value in headers:
        out.setdefault(name.lower(), []).append(value.strip())
    return out


def _denial_class(rule: RequestRule) -> RuleClass:
    if rule.paths:
        return "path"
    if rule.query:
        return "query"
    if rule.headers:
        return "header"
    return "method"


def _refusal_reason(rule_class: RuleClass, method: str) -> str:
    if rule_class == "method":
        return f"the policy does not allow {method} requests to this host"
    return f"the policy does not allow {method} to this {rule_class} on this host"


def judge(
    entry: InspectEntry, method: str, path: RequestPath, headers: dict[str, list[str]]
) -> tuple[bool, RequestRule | None, RuleClass]:
    """(allowed, the deciding rule, the class a denial names) for a checked path."""
    for rule in entry.deny:
        if (
            rule.method_matches(method)
            and rule.path_matches(path.segments)
            and rule.extras_match(path.query, headers, every=False)
        ):
            return False, rule, _denial_class(rule)
    method_allowed = False
    path_allowed = False
    for rule in entry.allow:
        if not rule.method_matches(method):
            continue
        method_allowed = True
        if not rule.path_matches(path.segments):
            continue
        path_allowed = True
        if rule.extras_match(path.query, headers, every=True):
            return True, rule, "method"
    if not method_allowed:
        return False, None, "method"
    if not path_allowed:
        return False, None, "path"
    extras = [r for r in entry.allow if r.method_matches(method) and r.path_matches(path.segments)]
    return False, None, "query" if any(r.query for r in extras) else "header"


def decide_request(policy: Policy, principal: Principal, facts: RequestFacts) -> RequestVerdict:
    """The verdict on one request; `uninspected` when no entry names its host and port."""
    entry = find_entry(policy, principal, facts.host, facts.port, tls=facts.tls)
    if entry is None:
        return RequestVerdict("uninspected", None, path=facts.target.partition("?")[0])
    mode = entry.mode or policy.mode_for(principal)
    method = facts.method.upper()
    try:
        path = split_target(facts.target)
    except GatewayError as exc:
        verdict: Verdict = "would_deny" if mode == "report" else "deny"
        return RequestVerdict(
            verdict, f"{entry.entry_id}.path_check", exc.code, exc.message, "url", facts.target.partition("?")[0]
        )
    allowed, rule, rule_class = judge(entry, method, path, _lower_headers(facts.headers))
    if allowed:
        assert rule is not None
        return RequestVerdict("allow", rule.rule_id, path=path.path)
    rule_id = rule.rule_id if rule is not None else f"{entry.entry_id}.default_deny"
    return RequestVerdict(
        "would_deny" if mode == "report" else "deny",
        rule_id,
        ErrorCode.POLICY_DENIED,
        _refusal_reason(rule_class, method),
        rule_class,
        path.path,
    )
