"""The policy's `transparent:` section: YAML nodes to `TransparentSettings`, line-numbered errors.

Owns the schema of transparent interception: principals by uid, the destination rule
(follow-name | strict), the raw TCP allow-list, and the DNS listener's answer for a denied name and
its allowed query types. Called by `load.parse_policy` with its node reader; never touches a file,
a socket or the running gateway.
"""

from __future__ import annotations

from dataclasses import replace

import yaml

from gateway.errors import GatewayError
from gateway.policy.model import Principal, RawTcpRule, TransparentSettings
from gateway.policy.node_reader import NodeReader
from gateway.vet.urls import vet_host

MAX_UID = 2**32 - 2
MAX_TRANSPARENT_PRINCIPALS = 64
# Record types a DNS listener may be told to pass; anything else is a typo in the policy.
KNOWN_QUERY_TYPES = frozenset(
    {"A", "AAAA", "CNAME", "MX", "TXT", "SRV", "PTR", "NS", "SOA", "CAA", "HTTPS", "SVCB", "ANY", "NAPTR", "DS"}
)
KEYS = frozenset({"principals", "default_principal", "destination", "raw_tcp", "dns"})
DNS_KEYS = frozenset({"denied_answer", "allow_types"})


def _raw_tcp(reader: NodeReader, node: yaml.Node) -> tuple[RawTcpRule, ...]:
    rules: list[RawTcpRule] = []
    for item in reader.sequence(node, "transparent.raw_tcp"):
        text = reader.string(item, "transparent.raw_tcp[]")
        if text is None:
            continue
        host, sep, port_text = text.rpartition(":")
        if not sep or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            reader.error(item, f"transparent.raw_tcp: {text!r} is not host:port")
            continue
        try:
            vetted = vet_host(host)
        except GatewayError as exc:
            reader.error(item, f"transparent.raw_tcp: {text!r}: {exc.message}")
            continue
        rules.append(RawTcpRule(vetted.name, vetted.ip, int(port_text)))
    return tuple(rules)


def parse_transparent(reader: NodeReader, node: yaml.Node, principals: dict[str, Principal]) -> TransparentSettings:
    items = reader.mapping(node, "transparent", KEYS)
    settings = TransparentSettings()
    changes: dict[str, object] = {}
    if "default_principal" in items:
        name = reader.string(items["default_principal"], "transparent.default_principal")
        if name is not None and name not in principals:
            reader.error(items["default_principal"], f"transparent.default_principal: no principal {name!r}")
        elif name is not None:
            changes["default_principal"] = name
    elif "default" not in principals:
        reader.error(node, "transparent needs a default_principal (the policy has no 'default' principal)")
    if "principals" in items:
        mapping: list[tuple[int, str]] = []
        pairs = items["principals"].value if isinstance(items["principals"], yaml.MappingNode) else None
        if pairs is None:
            reader.error(items["principals"], "transparent.principals must be a mapping of uid: principal")
            pairs = []
        for key_node, value_node in pairs:
            uid = reader.integer(key_node, "transparent.principals uid", 0, MAX_UID)
            name = reader.string(value_node, "transparent.principals[]")
            if uid is None or name is None:
                continue
            if name not in principals:
                reader.error(value_node, f"transparent.principals: uid {uid} names no principal {name!r}")
            elif any(listed == uid for listed, _ in mapping):
                reader.error(key_node, f"transparent.principals: uid {uid} is given twice")
            else:
                mapping.append((uid, name))
        if len(mapping) > MAX_TRANSPARENT_PRINCIPALS:
            reader.error(items["principals"], f"transparent.principals: at most {MAX_TRANSPARENT_PRINCIPALS} uids")
        changes["principals"] = tuple(sorted(mapping))
    if "destination" in items:
        changes["destination"] = reader.choice(
            items["destination"], "transparent.destination", ("follow-name", "strict")
        )
    if "raw_tcp" in items:
        changes["raw_tcp"] = _raw_tcp(reader, items["raw_tcp"])
    if "dns" in items:
        dns = reader.mapping(items["dns"], "transparent.dns", DNS_KEYS)
        if "denied_answer" in dns:
            changes["dns_denied_answer"] = reader.choice(
                dns["denied_answer"], "transparent.dns.denied_answer", ("nxdomain", "refused")
            )
        if "allow_types" in dns:
            types: list[str] = []
            for item in reader.sequence(dns["allow_types"], "transparent.dns.allow_types"):
                text = reader.string(item, "transparent.dns.allow_types[]")
                if text is None:
                    continue
                if text.upper() not in KNOWN_QUERY_TYPES:
                    reader.error(item, f"transparent.dns.allow_types: unknown query type {text!r}")
                    continue
                types.append(text.upper())
            changes["dns_allow_types"] = tuple(types)
    clean = {key: value for key, value in changes.items() if value is not None}
    return replace(settings, **clean)  # type: ignore[arg-type]
