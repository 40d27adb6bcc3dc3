"""What a policy change would allow or deny that the old policy did not, principal by principal.

Pure: takes two `Policy` values, returns lines for `egress-gateway policy lint --diff OLD NEW`.
It compares the rules as written (globs, CIDRs, switches, limits), the way a reviewer reads a
change; it never resolves a name.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.policy.model import Budgets, Policy, Principal


def _added_removed(old: Iterable[object], new: Iterable[object]) -> tuple[list[str], list[str]]:
    before, after = {str(v) for v in old}, {str(v) for v in new}
    return sorted(after - before), sorted(before - after)


def _widening(who: str, what: str, old: Iterable[object], new: Iterable[object], *, allows: bool) -> list[str]:
    """Lines for a list whose entries allow (allow_domains) or deny (deny_domains) when present."""
    added, removed = _added_removed(old, new)
    gained, lost = ("allows", "denies") if allows else ("denies", "allows")
    lines = [f"{who}: now {gained} {value} ({what} added)" for value in added]
    lines += [f"{who}: now {lost} {value} ({what} removed)" for value in removed]
    return lines


def _budget_lines(who: str, old: Budgets, new: Budgets) -> list[str]:
    lines: list[str] = []
    for tool in ("search", "fetch"):
        before, after = getattr(old, tool), getattr(new, tool)
        for field in ("per_step", "per_run", "concurrent", "min_interval_s", "lease_ttl_s"):
            a, b = getattr(before, field), getattr(after, field)
            if a != b:
                lines.append(f"{who}: budgets.{tool}.{field} {a} → {b}")
    return lines


def _principal_lines(policy_old: Policy, policy_new: Policy, old: Principal, new: Principal) -> list[str]:
    who = new.name
    lines = _widening(who, "allow_domains", old.egress.allow_domains, new.egress.allow_domains, allows=True)
    lines += _widening(who, "deny_domains", old.egress.deny_domains, new.egress.deny_domains, allows=False)
    old_internal = [f"{r.host} in {', '.join(map(str, r.cidrs))}" for r in old.egress.internal_hosts]
    new_internal = [f"{r.host} in {', '.join(map(str, r.cidrs))}" for r in new.egress.internal_hosts]
    lines += _widening(who, "internal_hosts", old_internal, new_internal, allows=True)
    for tool in ("search", "fetch"):
        before, after = getattr(old.tools, tool), getattr(new.tools, tool)
        if before != after:
            lines.append(f"{who}: now {'allows' if after else 'denies'} web_{tool} (tools.{tool})")
    mode_old, mode_new = policy_old.mode_for(old), policy_new.mode_for(new)
    if mode_old != mode_new:
        lines.append(f"{who}: mode {mode_old} → {mode_new}")
    if old.token_sha256 != new.token_sha256:
        lines.append(f"{who}: token_sha256 changed (the old credential stops working)")
    return lines + _budget_lines(who, old.budgets, new.budgets)


def describe_changes(old: Policy, new: Policy) -> list[str]:
    """One line per change in what the policy allows or denies; empty when nothing changed."""
    lines: list[str] = []
    everyone = "every principal"
    lines += _widening(everyone, "ports", old.defaults.ports, new.defaults.ports, allows=True)
    lines += _widening(everyone, "allow_cidrs", old.defaults.allow_cidrs, new.defaults.allow_cidrs, allows=True)
    lines += _widening(everyone, "deny_cidrs", old.defaults.deny_cidrs, new.defaults.deny_cidrs, allows=False)
    if old.defaults.literal_ips != new.defaults.literal_ips:
        verb = "allows" if new.defaults.literal_ips == "allow" else "denies"
        lines.append(f"{everyone}: now {verb} IP-literal hosts (literal_ips: {new.defaults.literal_ips})")
    for name in sorted(set(old.principals) | set(new.principals)):
        before, after = old.principals.get(name), new.principals.get(name)
        if before is None:
            lines.append(f"{name}: new principal")
            before = Principal(name=name)
        if after is None:
            lines.append(f"{name}: removed (its credential stops working)")
            continue
        lines += _principal_lines(old, new, before, after)
    return lines
