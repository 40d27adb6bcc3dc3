"""What a reviewer wants to know about `inspect:` rules beyond "it parses": rules that can never
decide (unreachable behind a deny, shadowed by an earlier rule, an entry behind an earlier
entry), and what a policy change opens or closes per host and method.

Pure: `Policy` values in, lines out, for `egress-gateway policy lint` and `lint --diff`.
Coverage is judged on the rules as written and only where it is certain (a glob that covers
another segment by segment); a warning is never a guess. Never resolves a name.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.policy.model import Policy
from gateway.policy.request_rules import KNOWN_METHODS, InspectEntry, PathGlob, RequestRule, wildcard_match


def _segments_cover(wide: Sequence[str], narrow: Sequence[str]) -> bool:
    """Every path `narrow`'s segments match is matched by `wide`'s."""
    if not wide:
        return not narrow
    if wide[0] == "**":
        return any(_segments_cover(wide[1:], narrow[k:]) for k in range(len(narrow) + 1))
    if not narrow or narrow[0] == "**":
        return False
    head_wide, head_narrow = wide[0], narrow[0]
    if head_wide in ("*", head_narrow):
        covered = True
    else:
        covered = not any(c in head_narrow for c in "*?") and wildcard_match(head_wide, head_narrow)
    return covered and _segments_cover(wide[1:], narrow[1:])


def glob_covers(wide: PathGlob, narrow: PathGlob) -> bool:
    return _segments_cover(wide.segments, narrow.segments)


def rule_covers(wide: RequestRule, narrow: RequestRule) -> bool:
    """Whether `wide` matches every request `narrow` matches (so `narrow` after it never decides)."""
    if wide.methods is not None and (narrow.methods is None or not narrow.methods <= wide.methods):
        return False
    if wide.paths:
        if not narrow.paths:
            return any(glob.segments == ("**",) for glob in wide.paths)
        if not all(any(glob_covers(w, n) for w in wide.paths) for n in narrow.paths):
            return False
    return set(wide.query) <= set(narrow.query) and set(wide.headers) <= set(narrow.headers)


def _host_covers(wide: str, narrow: str) -> bool:
    if wide in ("*", narrow):
        return True
    return wide.startswith("*.") and narrow.endswith(wide[1:]) and not narrow.startswith("*.")


def _ports_cover(wide: InspectEntry, narrow: InspectEntry) -> bool:
    if not wide.ports:
        # 443 for TLS and 80 for plain HTTP: an explicit list covers more than that pair.
        return not narrow.ports
    needed = set(narrow.ports) if narrow.ports else {80, 443}
    return needed <= set(wide.ports)


def _entry_warnings(where: str, entry: InspectEntry) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for index, rule in enumerate(entry.allow):
        blocker = next((d for d in entry.deny if rule_covers(d, rule)), None)
        if blocker is not None:
            out.append(
                (rule.line, f"{where}: rule {rule.rule_id} is unreachable: {blocker.rule_id} denies all it allows")
            )
            continue
        earlier = next((a for a in entry.allow[:index] if rule_covers(a, rule)), None)
        if earlier is not None:
            out.append((rule.line, f"{where}: rule {rule.rule_id} is shadowed by {earlier.rule_id} (it never decides)"))
    for index, rule in enumerate(entry.deny):
        earlier = next((d for d in entry.deny[:index] if rule_covers(d, rule)), None)
        if earlier is not None:
            out.append((rule.line, f"{where}: rule {rule.rule_id} is shadowed by {earlier.rule_id} (it never decides)"))
    return out


def _list_warnings(where: str, entries: Sequence[InspectEntry]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for index, entry in enumerate(entries):
        earlier = next(
            (e for e in entries[:index] if _host_covers(e.host, entry.host) and _ports_cover(e, entry)), None
        )
        if earlier is not None:
            out.append(
                (
                    entry.line,
                    f"{where}: {entry.entry_id} ({entry.host}) is unreachable: {earlier.entry_id} "
                    f"({earlier.host}) comes first and names every host and port it does",
                )
            )
            continue
        out += _entry_warnings(where, entry)
    return out


def lint_inspect(policy: Policy) -> list[str]:
    """`file:line: warning: ...` for every rule or entry that can never decide."""
    found = _list_warnings("defaults.inspect", policy.defaults.inspect)
    for name, principal in sorted(policy.principals.items()):
        found += _list_warnings(f"principals.{name}.inspect", principal.inspect)
    return [f"{policy.source}:{line}: warning: {text}" for line, text in sorted(found)]


def _path_part(rule: RequestRule) -> str:
    text = rule.describe()
    return text.partition(" ")[2]


def _by_host(entries: Sequence[InspectEntry]) -> dict[str, InspectEntry]:
    out: dict[str, InspectEntry] = {}
    for entry in entries:
        key = entry.host + (f":{','.join(map(str, entry.ports))}" if entry.ports else "")
        out.setdefault(key, entry)
    return out


def _method_lines(who: str, host: str, old: InspectEntry, new: InspectEntry) -> list[str]:
    lines: list[str] = []
    named = {m for e in (old, new) for r in (*e.allow, *e.deny) if r.methods for m in r.methods}
    for method in [*KNOWN_METHODS, *sorted(named - set(KNOWN_METHODS))]:
        before = {_path_part(r) for r in old.allow if r.method_matches(method)}
        after = {_path_part(r) for r in new.allow if r.method_matches(method)}
        denied_before = {_path_part(r) for r in old.deny if r.method_matches(method)}
        denied_after = {_path_part(r) for r in new.deny if r.method_matches(method)}
        lines += [f"{who}: {host} {method} opens {p} (allow added)" for p in sorted(after - before)]
        lines += [f"{who}: {host} {method} closes {p} (allow removed)" for p in sorted(before - after)]
        lines += [f"{who}: {host} {method} closes {p} (deny added)" for p in sorted(denied_after - denied_before)]
        lines += [f"{who}: {host} {method} opens {p} (deny removed)" for p in sorted(denied_before - denied_after)]
    if (old.mode or "") != (new.mode or ""):
        lines.append(f"{who}: {host} mode {old.mode or 'inherited'} → {new.mode or 'inherited'}")
    return lines


def _list_changes(who: str, old: Sequence[InspectEntry], new: Sequence[InspectEntry]) -> list[str]:
    before, after = _by_host(old), _by_host(new)
    lines: list[str] = []
    for host in sorted(set(before) | set(after)):
        if host not in before:
            lines.append(f"{who}: {host} now inspected (requests judged by its rules, the rest closed)")
            lines += _method_lines(who, host, InspectEntry("", host, 0), after[host])
        elif host not in after:
            lines.append(f"{who}: {host} no longer inspected (every request passes unjudged)")
        else:
            lines += _method_lines(who, host, before[host], after[host])
    return lines


def describe_inspect_changes(old: Policy, new: Policy) -> list[str]:
    """What a change opens or closes, per principal, host and method."""
    lines = _list_changes("every principal", old.defaults.inspect, new.defaults.inspect)
    for name in sorted(set(old.principals) & set(new.principals)):
        lines += _list_changes(name, old.principals[name].inspect, new.principals[name].inspect)
    for name in sorted(set(new.principals) - set(old.principals)):
        lines += _list_changes(name, (), new.principals[name].inspect)
    return lines
