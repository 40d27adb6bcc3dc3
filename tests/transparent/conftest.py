"""The shared pod + internet topology of the transparent tests: built once per module, removed after."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.transparent.netns import (
    AGENT_UID,
    CODER_UID,
    DNS_V4,
    ORIGIN_V4,
    ORIGIN_V6,
    OTHER_V4,
    PRIVATE_V4,
    Topology,
    require_netns,
)

# Enough A records that the answer does not fit 512 bytes of classic UDP.
MANY = [f"203.0.113.{i}" for i in range(64, 104)]
# Outside every subnet of the pod: routed into the internet namespace, which has no such host
# and forwards nothing, so a SYN to it is dropped (neither answered nor refused).
SILENT_V4 = "198.51.100.7"
WORLD: dict[str, Any] = {
    "dns_ip": DNS_V4,
    "dns": {
        "docs.example.org": [ORIGIN_V4, ORIGIN_V6],
        "code.example.net": [OTHER_V4],
        "blocked.example.net": [OTHER_V4],
        "private.example.org": [PRIVATE_V4],
        "mixed.example.org": [ORIGIN_V4, PRIVATE_V4],
        "many.example.org": MANY,
        "silent.example.org": [SILENT_V4],
    },
    # TTL 0 (every lookup asks upstream) but for one name, whose caching the DNS tests watch.
    "dns_ttl": {"code.example.net": 60},
    "origins": [
        {"ip": ORIGIN_V4, "port": 443, "tls": True, "names": ["docs.example.org"]},
        {"ip": ORIGIN_V4, "port": 80, "tls": False, "names": ["docs.example.org"]},
        {"ip": OTHER_V4, "port": 443, "tls": True, "names": ["code.example.net", "blocked.example.net"]},
        {"ip": ORIGIN_V6, "port": 443, "tls": True, "names": ["docs.example.org"]},
    ],
    "raw": [{"ip": ORIGIN_V4, "port": 22}],
    "udp": [{"ip": ORIGIN_V4, "port": 9999}],
}


def transparent_policy(destination: str = "follow-name", **transparent: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "defaults": {
            "ports": [22, 80, 443],
            "allow_cidrs": [f"{ORIGIN_V4}/32", f"{OTHER_V4}/32", f"{ORIGIN_V6}/128", "203.0.113.64/26"],
        },
        "principals": {
            "default": {"egress": {"allow_domains": ["docs.example.org"]}},
            "research": {"egress": {"allow_domains": ["docs.example.org", "private.example.org", "many.example.org"]}},
            "coder": {"egress": {"allow_domains": ["code.example.net"]}},
        },
        "transparent": {
            "principals": {AGENT_UID: "research", CODER_UID: "coder"},
            "destination": destination,
            **transparent,
        },
    }


@pytest.fixture(scope="module")
def pod() -> Iterator[Topology]:
    require_netns()
    topology = Topology("mod")
    try:
        topology.build()
        topology.start_world(WORLD)
        topology.start_gateway(transparent_policy())
        topology.redirect("--apply")
        yield topology
    finally:
        topology.destroy()
