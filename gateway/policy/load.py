"""Policy YAML → `Policy`, with `file:line: reason` errors, and the hot-reloading holder.

Validation walks PyYAML's node tree (not the plain dict) so every error points at the line that
caused it. A reload that fails keeps the last good policy. Every successful load gets the next
generation number, which tool calls compare to notice a policy change mid-flight.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gateway.policy.credentials import parse_credentials, parse_scan
from gateway.policy.inspect_load import parse_inspect
from gateway.policy.model import (
    Budgets,
    CredentialSettings,
    Defaults,
    EgressRule,
    FetchSettings,
    InternalHostRule,
    Orchestrator,
    Policy,
    Principal,
    ProxySettings,
    SearchSettings,
    ToolLimits,
    ToolSwitches,
    TransparentSettings,
)
from gateway.policy.node_reader import NodeReader, normalise_glob
from gateway.policy.transparent import parse_transparent
from gateway.vet.urls import internal_suffix_reason, refused_name_reason

log = logging.getLogger("egress_gateway.policy")

T = TypeVar("T")
# libyaml's composer, where PyYAML was built with it, is ~15x faster than the pure-Python one (a
# reload runs on the event loop). Both give the same nodes and lines; only the pure-Python
# parser's error wording names the offending token, so a file that fails is parsed again by it.
_FAST_LOADER: type[yaml.CSafeLoader] | None = getattr(yaml, "CSafeLoader", None)
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_PRINCIPAL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class PolicyError(Exception):
    """A policy file is invalid; `errors` holds `file:line: reason` lines."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("; ".join(errors))


def _tool_budget(reader: NodeReader, node: yaml.Node, where: str, base: ToolLimits) -> ToolLimits:
    counts = ("per_step", "per_run", "concurrent", "per_minute", "per_hour", "per_day", "max_live_ids")
    keys = {*counts, "min_interval_s", "lease_ttl_s"}
    items = reader.mapping(node, where, keys)
    changes: dict[str, Any] = {}
    for key in counts:
        if key in items:
            # Windows may be set very high to effectively lift them; they cannot be turned off.
            high = 1_000_000_000 if key.startswith(("per_minute", "per_hour", "per_day")) else 1_000_000
            value = reader.integer(items[key], f"{where}.{key}", 0, high)
            if value is not None:
                changes[key] = value
    # A lease must live a while or every slot frees itself at once; an interval may be 0.
    for key, low in (("min_interval_s", 0.0), ("lease_ttl_s", 0.1)):
        if key in items:
            number = reader.number(items[key], f"{where}.{key}", low, 86_400.0)
            if number is not None:
                changes[key] = number
    return replace(base, **changes)


def _principal(reader: NodeReader, name: str, node: yaml.Node) -> Principal:
    where = f"principals.{name}"
    items = reader.mapping(node, where, {"token_sha256", "egress", "tools", "budgets", "mode", "inspect", "scan"})
    principal = Principal(name=name)
    token = None
    if "token_sha256" in items:
        token = reader.string(items["token_sha256"], f"{where}.token_sha256")
        if token is not None and not _SHA256_HEX.match(token):
            reader.error(items["token_sha256"], f"{where}.token_sha256 must be 64 lowercase hex digits")
            token = None
    egress = EgressRule()
    if "egress" in items:
        rule = reader.mapping(items["egress"], f"{where}.egress", {"allow_domains", "deny_domains", "internal_hosts"})
        internal: list[InternalHostRule] = []
        for entry in (
            reader.sequence(rule["internal_hosts"], f"{where}.egress.internal_hosts")
            if "internal_hosts" in rule
            else []
        ):
            fields_ = reader.mapping(entry, f"{where}.egress.internal_hosts[]", {"host", "cidrs"})
            host_node, cidr_node = fields_.get("host"), fields_.get("cidrs")
            if host_node is None or cidr_node is None:
                reader.error(entry, f"{where}.egress.internal_hosts entries need host and cidrs")
                continue
            host = reader.string(host_node, f"{where}.egress.internal_hosts[].host")
            glob = normalise_glob(host) if host else None
            if glob is None or glob.startswith("*"):
                reader.error(host_node, f"{where}.egress.internal_hosts[].host must be one exact name")
                continue
            # What serve refuses whatever the policy says, lint refuses too: an in-cluster name
            # (`*.svc`, `*.cluster.local`) may be opened, `localhost`, `metadata` or one label not.
            refused = refused_name_reason(glob)
            if refused is not None and internal_suffix_reason(glob) is None:
                reader.error(host_node, f"{where}.egress.internal_hosts[].host {refused}: it cannot be opened")
                continue
            internal.append(InternalHostRule(glob, reader.cidrs(cidr_node, f"{where}.egress.internal_hosts[].cidrs")))
        egress = EgressRule(
            allow_domains=reader.domain_globs(rule["allow_domains"], f"{where}.egress.allow_domains")
            if "allow_domains" in rule
            else (),
            deny_domains=reader.domain_globs(rule["deny_domains"], f"{where}.egress.deny_domains")
            if "deny_domains" in rule
            else (),
            internal_hosts=tuple(internal),
        )
    tools = ToolSwitches()
    if "tools" in items:
        switches = reader.mapping(items["tools"], f"{where}.tools", {"search", "fetch"})
        tools = ToolSwitches(
            search=bool(reader.boolean(switches["search"], f"{where}.tools.search")) if "search" in switches else False,
            fetch=bool(reader.boolean(switches["fetch"], f"{where}.tools.fetch")) if "fetch" in switches else False,
        )
    budgets = Budgets()
    if "budgets" in items:
        per_tool = reader.mapping(items["budgets"], f"{where}.budgets", {"search", "fetch"})
        budgets = Budgets(
            search=_tool_budget(reader, per_tool["search"], f"{where}.budgets.search", budgets.search)
            if "search" in per_tool
            else budgets.search,
            fetch=_tool_budget(reader, per_tool["fetch"], f"{where}.budgets.fetch", budgets.fetch)
            if "fetch" in per_tool
            else budgets.fetch,
        )
    mode = reader.choice(items["mode"], f"{where}.mode", ("enforce", "report")) if "mode" in items else None
    scan = parse_scan(reader, items["scan"], f"{where}.scan") if "scan" in items else None
    inspect = parse_inspect(reader, items["inspect"], f"{where}.inspect", "inspect") if "inspect" in items else ()
    return replace(
        principal,
        token_sha256=token,
        egress=egress,
        tools=tools,
        budgets=budgets,
        mode=mode,  # type: ignore[arg-type]
        inspect=inspect,
        scan=scan,
    )


def _orchestrators(reader: NodeReader, node: yaml.Node, principals: dict[str, Principal]) -> dict[str, Orchestrator]:
    """`orchestrators:` name -> {token_sha256, principals, max_ttl_s} (the run token minters)."""
    out: dict[str, Orchestrator] = {}
    for name, entry in reader.mapping(node, "orchestrators", set()).items():
        where = f"orchestrators.{name}"
        if not _PRINCIPAL_NAME.match(name):
            reader.error(entry, f"orchestrator name {name!r} must be 1-64 letters, digits, '.', '_' or '-'")
            continue
        items = reader.mapping(entry, where, {"token_sha256", "principals", "max_ttl_s"})
        token = reader.string(items["token_sha256"], f"{where}.token_sha256") if "token_sha256" in items else None
        if "token_sha256" not in items:
            reader.error(entry, f"{where}.token_sha256 is required")
        elif token is not None and not _SHA256_HEX.match(token):
            reader.error(items["token_sha256"], f"{where}.token_sha256 must be 64 lowercase hex digits")
            token = None
        names: list[str] = []
        if "principals" in items:
            for item in reader.sequence(items["principals"], f"{where}.principals"):
                text = reader.string(item, f"{where}.principals")
                if text is not None and text != "*" and text not in principals:
                    reader.error(item, f"{where}.principals: no principal named {text!r}")
                elif text is not None:
                    names.append(text)
        max_ttl_s = 86_400.0
        if "max_ttl_s" in items:
            number = reader.number(items["max_ttl_s"], f"{where}.max_ttl_s", 1.0, 86_400.0 * 7)
            max_ttl_s = number if number is not None else max_ttl_s
        if token is not None:
            out[name] = Orchestrator(name, token, tuple(names), max_ttl_s)
    return out


def _defaults(reader: NodeReader, node: yaml.Node) -> Defaults:
    items = reader.mapping(
        node, "defaults", {"mode", "ports", "literal_ips", "allow_cidrs", "deny_cidrs", "inspect", "scan"}
    )
    defaults = Defaults()
    changes: dict[str, Any] = {}
    if "mode" in items:
        changes["mode"] = reader.choice(items["mode"], "defaults.mode", ("enforce", "report"))
    if "literal_ips" in items:
        changes["literal_ips"] = reader.choice(items["literal_ips"], "defaults.literal_ips", ("deny", "allow"))
    if "ports" in items:
        ports = [
            reader.integer(p, "defaults.ports", 1, 65535) for p in reader.sequence(items["ports"], "defaults.ports")
        ]
        changes["ports"] = tuple(p for p in ports if p is not None)
        if not changes["ports"]:
            reader.error(items["ports"], "defaults.ports must name at least one port")
    if "allow_cidrs" in items:
        changes["allow_cidrs"] = reader.cidrs(items["allow_cidrs"], "defaults.allow_cidrs")
    if "deny_cidrs" in items:
        changes["deny_cidrs"] = reader.cidrs(items["deny_cidrs"], "defaults.deny_cidrs")
    if "scan" in items:
        changes["scan"] = parse_scan(reader, items["scan"], "defaults.scan")
    if "inspect" in items:
        changes["inspect"] = parse_inspect(reader, items["inspect"], "defaults.inspect", "defaults.inspect")
    return replace(defaults, **{k: v for k, v in changes.items() if v is not None})


def _compose(text: str) -> yaml.Node | None:
    if _FAST_LOADER is not None:
        try:
            return yaml.compose(text, Loader=_FAST_LOADER)
        except yaml.YAMLError:
            pass  # the same error again below, in the words that name the token
    return yaml.compose(text, Loader=yaml.SafeLoader)


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Validate policy text; raise PolicyError listing every problem with its line."""
    reader = NodeReader(source)
    try:
        root = _compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError([f"{source}:{line}: YAML syntax error: {problem}"]) from None
    if root is None:
        raise PolicyError([f"{source}:1: the policy file is empty"])
    top = reader.mapping(
        root,
        "policy",
        {
            "version",
            "defaults",
            "principals",
            "fetch",
            "search",
            "proxy",
            "transparent",
            "orchestrators",
            "credentials",
        },
    )
    version = reader.integer(top["version"], "version", 1, 1) if "version" in top else None
    if "version" not in top:
        reader.error(root, "version is required (version: 1)")
    defaults = _defaults(reader, top["defaults"]) if "defaults" in top else Defaults()
    principals: dict[str, Principal] = {}
    if "principals" in top:
        for name, node in reader.mapping(top["principals"], "principals", set()).items():
            if not _PRINCIPAL_NAME.match(name):
                reader.error(node, f"principal name {name!r} must be 1-64 letters, digits, '.', '_' or '-'")
                continue
            principals[name] = _principal(reader, name, node)
    hashes = [p.token_sha256 for p in principals.values() if p.token_sha256]
    if len(hashes) != len(set(hashes)):
        reader.error(top.get("principals", root), "two principals share one token_sha256")
    orchestrators = _orchestrators(reader, top["orchestrators"], principals) if "orchestrators" in top else {}
    # An agent whose token also minted run tokens could vouch for itself.
    minting = [o.token_sha256 for o in orchestrators.values()]
    if len(minting) != len(set(minting)) or set(minting) & set(hashes):
        reader.error(top["orchestrators"], "an orchestrator's token_sha256 must be its own (not a principal's)")
    fetch = reader.dataclass_fields(top["fetch"], "fetch", FetchSettings()) if "fetch" in top else FetchSettings()
    search = reader.dataclass_fields(top["search"], "search", SearchSettings()) if "search" in top else SearchSettings()
    proxy = reader.dataclass_fields(top["proxy"], "proxy", ProxySettings()) if "proxy" in top else ProxySettings()
    transparent = (
        parse_transparent(reader, top["transparent"], principals) if "transparent" in top else TransparentSettings()
    )
    credentials = (
        parse_credentials(reader, top["credentials"], principals) if "credentials" in top else CredentialSettings()
    )
    if reader.errors:
        raise PolicyError(reader.errors)
    assert version is not None
    return Policy(
        version,
        defaults,
        principals,
        fetch,
        search,
        proxy,
        source,
        transparent=transparent,
        orchestrators=orchestrators,
        credentials=credentials,
    )


def load_policy_file(path: str | os.PathLike[str]) -> Policy:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        # No line to point at: `file: reason`, in the OS's words ("No such file or directory").
        raise PolicyError([f"{path}: cannot read the policy file: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise PolicyError([f"{path}: cannot read the policy file: not UTF-8 text (byte {exc.start})"]) from None
    return parse_policy(text, str(path))
