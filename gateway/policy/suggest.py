"""Learn mode: the smallest policy that would have allowed what an audit log saw.

Pure: takes audit lines (text), an optional base policy document (the YAML as plain data) and a
time bound, and returns the suggested policy document plus what a reviewer must read beside it
(denials and would-deny lines with counts, destinations the address guard refused). It never
reads a file, never resolves a name and never opens an address range: an address the guard
refused is listed with the hint to use `internal_hosts` on purpose, never suggested.

Hosts are grouped into a glob only where several subdomains of one registrable domain were
seen; the registrable domain comes from the Public Suffix List as the `publicsuffixlist`
package ships it (its ICANN and private sections, so `a.github.io` and `b.github.io` stay two
entries). The package reads its bundled copy of the list; nothing is fetched at run time.
"""

from __future__ import annotations

import copy
import ipaddress
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from types import MappingProxyType
from typing import Any

import orjson
from publicsuffixlist import PublicSuffixList

from gateway.errors import ErrorCode, GatewayError
from gateway.policy.suggest_inspect import base_entry_for, inspect_entries
from gateway.vet.addresses import AddressGuard, AddressVerdict, IPNetwork

# Kinds whose lines carry a destination the principal's egress rules decided.
_DESTINATION_KINDS = frozenset({"connect", "http", "transparent", "dns", "fetch", "inspect"})
_TOOL_KINDS = frozenset({"fetch", "search"})
# Rules of the address guard (docs/reference/audit-log.md, the `rule` table): an address range or an internal
# name. Opening one is a decision to make on purpose (`internal_hosts`), never a suggestion.
_GUARD_RULES = frozenset({"builtin_ranges", "builtin_names", "own_addresses", "address_guard"})
INTERNAL_HOSTS_HINT = (
    "not suggested: to reach an internal service on purpose, name it in the principal's "
    "egress.internal_hosts with its CIDRs"
)
UNAUTHENTICATED = "(no principal)"


@lru_cache(maxsize=1)
def _suffix_list() -> PublicSuffixList:
    # Built once from the list bundled in the package (about 10k rules): no download, no cache dir.
    return PublicSuffixList()


def registrable_domain(host: str) -> str | None:
    """The registrable domain (eTLD+1) of `host`, or None for an IP, a suffix or one label."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return None
    domain: str | None = _suffix_list().privatesuffix(host)
    return domain


def group_hosts(hosts: Iterable[str]) -> list[str]:
    """Exact names, and `*.parent` where two or more subdomains of one registrable domain were seen.

    `parent` is the longest common parent of those subdomains (never shorter than the registrable
    domain), so `a.api.example.com` and `b.api.example.com` give `*.api.example.com`. An apex that
    was itself seen stays an exact entry: `*.example.com` does not match `example.com`.
    """
    exact: set[str] = set()
    by_domain: dict[str, set[str]] = {}
    for host in set(hosts):
        domain = registrable_domain(host)
        if domain is None or domain == host:
            exact.add(host)
        else:
            by_domain.setdefault(domain, set()).add(host)
    entries = set(exact)
    for domain, subdomains in by_domain.items():
        if len(subdomains) < 2:
            entries |= subdomains
            continue
        parent = _common_parent([sub.split(".") for sub in subdomains], domain)
        entries.add(f"*.{parent}")
    return sorted(entries, key=lambda entry: (entry.lstrip("*.").split(".")[::-1], entry))


def _common_parent(labels: list[list[str]], domain: str) -> str:
    """The longest dotted suffix all names share that is a strict parent of each of them."""
    shortest = min(len(name) for name in labels) - 1  # a parent, never a name itself
    common: list[str] = []
    for depth in range(1, shortest + 1):
        label = {name[-depth] for name in labels}
        if len(label) != 1:
            break
        common.insert(0, label.pop())
    parent = ".".join(common)
    return parent if parent.endswith(domain) else domain


@dataclass(frozen=True, slots=True)
class Refusal:
    """Identical refused (or would-be refused) requests, counted."""

    principal: str
    host: str
    port: int | None
    code: str
    rule: str
    rule_pattern: str
    kinds: tuple[str, ...]
    count: int

    def describe(self) -> str:
        where = self.host if self.port is None else f"{self.host}:{self.port}"
        rule = f"{self.rule} {self.rule_pattern}".strip()
        return f"{self.principal}  {where}  {self.code}  ({rule}; {', '.join(self.kinds)})  {self.count} time(s)"


@dataclass(slots=True)
class _Seen:
    """What one principal was allowed (or, in report mode, let through)."""

    hosts: set[str] = field(default_factory=set)
    ports: set[int] = field(default_factory=set)
    tools: set[str] = field(default_factory=set)
    internal_hosts: set[str] = field(default_factory=set)
    literal_ips: bool = False
    requests: int = 0
    # host -> method -> paths, and host -> ports, of lines that carry a method and a path.
    paths: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    path_ports: dict[str, set[int]] = field(default_factory=dict)
    # Hosts the lines themselves say were inspected (kind `inspect`, a request rule's id).
    inspected: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Suggestion:
    document: dict[str, Any]
    principals: tuple[str, ...]
    denied: tuple[Refusal, ...]
    would_deny: tuple[Refusal, ...]
    guarded: tuple[Refusal, ...]
    unresolved: tuple[Refusal, ...]
    decisions: int
    skipped_lines: int
    first_time: str | None
    last_time: str | None
    notes: tuple[str, ...]


def parse_audit_lines(lines: Iterable[bytes | str]) -> tuple[list[dict[str, Any]], int]:
    """(audit objects, lines skipped): a line that is not a JSON object with `event` is skipped,
    so a last line cut by a killed process costs one line, not the report."""
    entries: list[dict[str, Any]] = []
    skipped = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            skipped += 1
            continue
        if isinstance(value, dict) and isinstance(value.get("event"), str):
            entries.append(value)
        else:
            skipped += 1
    return entries, skipped


def _time_of(entry: Mapping[str, Any]) -> datetime | None:
    text = entry.get("time")
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _is_guard_refusal(entry: Mapping[str, Any]) -> bool:
    rule = str(entry.get("rule", ""))
    return entry.get("code") == "blocked_destination" or rule in _GUARD_RULES or rule.startswith("defaults.deny_cidrs")


class _Tally:
    """Refusals counted by (principal, host, port, code, rule)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, int | None, str, str, str]] = Counter()
        self.kinds: dict[tuple[str, str, int | None, str, str, str], set[str]] = {}

    def add(self, entry: Mapping[str, Any], count: int = 1, verdict: AddressVerdict | None = None) -> None:
        port = entry.get("port")
        code, rule, pattern = entry.get("code", ""), entry.get("rule", ""), entry.get("rule_pattern", "")
        if verdict is not None:
            code, rule, pattern = "blocked_destination", verdict.rule, verdict.pattern
        key = (
            str(entry.get("principal") or UNAUTHENTICATED),
            str(entry.get("host", "?")),
            port if isinstance(port, int) else None,
            str(code),
            str(rule or ""),
            str(pattern or ""),
        )
        self.counts[key] += count
        self.kinds.setdefault(key, set()).add(str(entry.get("kind", "?")))

    def refusals(self) -> tuple[Refusal, ...]:
        out = [Refusal(*key, kinds=tuple(sorted(self.kinds[key])), count=n) for key, n in self.counts.items()]
        return tuple(sorted(out, key=lambda r: (r.principal, -r.count, r.host, r.port or 0)))


def suggest(
    entries: Iterable[Mapping[str, Any]],
    *,
    base: Mapping[str, Any] | None = None,
    principal: str | None = None,
    since: datetime | None = None,
    skipped_lines: int = 0,
) -> Suggestion:
    """The suggested policy document and the review that goes with it.

    Lines that count as traffic the policy must keep allowing: `allow` and `would_deny`
    decisions (report mode let those through), except address-guard refusals and names that
    did not resolve. `deny` lines are listed, never suggested: the agent tried, the policy
    refused, and opening them is the reviewer's call.
    """
    guard = _address_guard(base)
    seen: dict[str, _Seen] = {}
    denied, would_deny, guarded, unresolved = _Tally(), _Tally(), _Tally(), _Tally()
    decisions = 0
    times: list[str] = []
    for entry in entries:
        when = _time_of(entry)
        if since is not None and (when is None or when < since):
            continue
        name = entry.get("principal")
        if principal is not None and name != principal:
            continue
        event, verdict = entry.get("event"), entry.get("decision")
        if event == "repeated" and verdict in ("deny", "would_deny"):
            # The first of a burst was written as a decision line; `count` more followed it.
            count = entry.get("count")
            (guarded if _is_guard_refusal(entry) else denied if verdict == "deny" else would_deny).add(
                entry, count if isinstance(count, int) and count > 0 else 1
            )
            continue
        # An inspected request that was let through is written once, as its close line.
        counted = event == "decision" or (event == "close" and entry.get("kind") == "inspect")
        if not counted or verdict not in ("allow", "deny", "would_deny"):
            continue
        decisions += 1
        times.append(str(entry.get("time", "")))
        if _is_guard_refusal(entry):
            guarded.add(entry)
            continue
        # Report mode writes the first would-deny only (often the name's): the addresses the
        # name resolved to are vetted here again, so an internal one is never suggested.
        refused_address = _refused_address(guard, entry)
        if refused_address is not None:
            guarded.add(entry, verdict=refused_address)
            continue
        if verdict == "deny":
            denied.add(entry)
            continue
        if verdict == "would_deny":
            would_deny.add(entry)
        if entry.get("kind") in _DESTINATION_KINDS and (
            entry.get("code") == "dns_failure" or entry.get("outcome") == "dns_error"
        ):
            unresolved.add(entry)
            continue
        if isinstance(name, str):
            _record(seen.setdefault(name, _Seen()), entry)
    document, notes = _document(seen, base, principal)
    return Suggestion(
        document=document,
        principals=tuple(sorted(seen)),
        denied=denied.refusals(),
        would_deny=would_deny.refusals(),
        guarded=guarded.refusals(),
        unresolved=unresolved.refusals(),
        decisions=decisions,
        skipped_lines=skipped_lines,
        first_time=min(times) if times else None,
        last_time=max(times) if times else None,
        notes=tuple(notes),
    )


def _address_guard(base: Mapping[str, Any] | None) -> AddressGuard:
    """The address table the base policy enforces (no exceptions without a base)."""
    defaults = (base or {}).get("defaults") or {}
    ranges: dict[str, list[IPNetwork]] = {"allow_cidrs": [], "deny_cidrs": []}
    for key, nets in ranges.items():
        for text in defaults.get(key) or []:
            try:
                nets.append(ipaddress.ip_network(str(text), strict=False))
            except ValueError:
                continue  # the CLI validated the base; a bad entry here opens nothing
    return AddressGuard(ranges["allow_cidrs"], ranges["deny_cidrs"])


def _refused_address(guard: AddressGuard, entry: Mapping[str, Any]) -> AddressVerdict | None:
    """The guard's refusal of an address the line says its name resolved to (or was dialled)."""
    if str(entry.get("rule", "")).startswith("internal_hosts["):
        return None  # the principal opened this name's ranges on purpose
    texts = entry.get("addresses")
    candidates = [*texts] if isinstance(texts, list) else []
    if isinstance(entry.get("address"), str):
        candidates.append(entry["address"])
    for text in candidates:
        try:
            address = ipaddress.ip_address(str(text))
        except ValueError:
            continue
        verdict = guard.vet(address)
        if not verdict.allowed:
            return verdict
    return None


def _record(seen: _Seen, entry: Mapping[str, Any]) -> None:
    kind, host, port = entry.get("kind"), entry.get("host"), entry.get("port")
    seen.requests += 1
    if kind in _TOOL_KINDS:
        seen.tools.add(str(kind))
    if kind not in _DESTINATION_KINDS or not isinstance(host, str) or not host:
        return
    # A DNS query's port is the resolver's, not a destination the agent connects to.
    if isinstance(port, int) and kind != "dns":
        seen.ports.add(port)
    if str(entry.get("rule", "")).startswith("internal_hosts["):
        seen.internal_hosts.add(host)
        return
    seen.hosts.add(host)
    method, path = entry.get("method"), entry.get("path")
    if isinstance(method, str) and isinstance(path, str):
        seen.paths.setdefault(host, {}).setdefault(method.upper(), set()).add(path)
        if isinstance(port, int):
            seen.path_ports.setdefault(host, set()).add(port)
        if kind == "inspect" or "inspect[" in str(entry.get("rule", "")):
            seen.inspected.add(host)
    try:
        ipaddress.ip_address(host)
        seen.literal_ips = True
    except ValueError:
        pass


def _document(
    seen: Mapping[str, _Seen], base: Mapping[str, Any] | None, only: str | None
) -> tuple[dict[str, Any], list[str]]:
    """The policy document: the base with each seen principal's egress and tools replaced and the
    policy enforcing, or a fresh minimal policy without a base."""
    notes: list[str] = []
    document: dict[str, Any] = copy.deepcopy(dict(base)) if base is not None else {"version": 1}
    defaults: dict[str, Any] = document.setdefault("defaults", {}) or {}
    document["defaults"] = defaults
    principals: dict[str, Any] = document.setdefault("principals", {}) or {}
    document["principals"] = principals
    ports = set().union(*(s.ports for s in seen.values())) if seen else set()
    if base is not None and only is not None:
        # Other principals keep what the base gave them, ports included.
        ports |= set(defaults.get("ports") or [80, 443])
    if ports:
        defaults["ports"] = sorted(ports)
    defaults["mode"] = "enforce"
    if any(s.literal_ips for s in seen.values()):
        defaults["literal_ips"] = "allow"
    for name, used in sorted(seen.items()):
        entry: dict[str, Any] = principals.get(name) or {}
        if name not in principals and name != "default":
            notes.append(f"{name}: not in the base policy; add its token_sha256 (egress-gateway policy token)")
        egress: dict[str, Any] = dict(entry.get("egress") or {})
        egress["allow_domains"] = group_hosts(used.hosts)
        kept = [
            rule
            for rule in egress.get("internal_hosts") or []
            if isinstance(rule, Mapping) and rule.get("host") in used.internal_hosts
        ]
        if kept:
            egress["internal_hosts"] = kept
        else:
            egress.pop("internal_hosts", None)
        entry["egress"] = egress
        _learn_inspect(entry, used, defaults.get("inspect") or [])
        entry["tools"] = {"search": "search" in used.tools, "fetch": "fetch" in used.tools}
        tools = ", ".join(sorted(used.tools)) or "none"
        notes.append(
            f"{name}: {used.requests} request(s), {len(used.hosts)} host(s) in "
            f"{len(egress['allow_domains'])} allow_domains entr(ies), ports "
            f"{','.join(map(str, sorted(used.ports))) or '-'}, tools {tools}"
        )
        entry.pop("mode", None)
        principals[name] = entry
    return document, notes


def _learn_inspect(entry: dict[str, Any], used: _Seen, shared: list[Any]) -> None:
    """Methods and path prefixes for the hosts that were inspected (by the lines or the base)."""
    own = [e for e in entry.get("inspect") or [] if isinstance(e, Mapping)]
    shared_entries = [e for e in shared if isinstance(e, Mapping)]
    inspected = {
        host: methods
        for host, methods in used.paths.items()
        if host in used.inspected
        or base_entry_for(host, own) is not None
        or base_entry_for(host, shared_entries) is not None
    }
    if inspected or own:
        entry["inspect"] = inspect_entries(inspected, used.path_ports, own)


def review_lines(suggestion: Suggestion, source: str) -> list[str]:
    """What a reviewer reads beside the suggested policy, one line each (no comment marks)."""
    span = (
        f", {suggestion.first_time} to {suggestion.last_time}"
        if suggestion.first_time is not None
        else ", no decisions"
    )
    lines = [
        f"suggested by `egress-gateway policy suggest` from {source}: {suggestion.decisions} decision line(s){span}"
    ]
    if suggestion.skipped_lines:
        lines.append(f"{suggestion.skipped_lines} line(s) skipped: not audit JSON")
    lines += suggestion.notes
    sections = (
        ("denied (the policy refused them; not suggested)", suggestion.denied),
        ("would deny (report mode let them through; suggested above, review each)", suggestion.would_deny),
        (f"refused by the address guard ({INTERNAL_HOSTS_HINT})", suggestion.guarded),
        ("did not resolve (not suggested)", suggestion.unresolved),
    )
    for title, refusals in sections:
        if refusals:
            lines.append(f"{title}: {sum(r.count for r in refusals)}")
            lines += [f"  {refusal.describe()}" for refusal in refusals]
    return lines


_UNIT_SECONDS = MappingProxyType({"s": 1, "m": 60, "h": 3600, "d": 86_400})


def parse_since(text: str, now: datetime) -> datetime:
    """`--since`: an RFC 3339 time (`2026-12-01T11:00:00Z`) or an age before `now` (`90m`, `2h`, `7d`)."""
    value = text.strip()
    unit = _UNIT_SECONDS.get(value[-1:]) if value else None
    if unit is not None and value[:-1].isdigit():
        return now - timedelta(seconds=int(value[:-1]) * unit)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        when = None
    if when is None:
        raise GatewayError(
            ErrorCode.INVALID_INPUT,
            f"--since {text!r} is neither a time (2026-12-01T11:00:00Z) nor an age (30m, 2h, 7d)",
        )
    # A time without a zone is read as UTC, the audit log's zone.
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
