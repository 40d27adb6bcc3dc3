"""Every key the policy loader accepts is documented in its section of docs/reference/policy.md.

The policy page is written by hand (its keys need more words than a table generated from the
code could give them), so it is checked against the loader instead: a policy that uses every
section (inspect entries and their rules, scan, credentials included) is parsed with the loader's
`mapping` calls recorded, which gives each section's allowed key set exactly as the loader holds
it (`version`, `defaults`, ... at the top; `egress`, `tools`, `budgets`, ... per principal; the
`fetch`/`search`/`proxy` dataclass fields). Each key must appear in backticks in the page's
section for that part of the file. A part of the file the loader reads and this test does not map
fails the test, so a new section gets a place on the page.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.policy import load, node_reader

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "policy.md"
TOKEN_A = "a" * 64
TOKEN_B = "b" * 64

# A policy touching every section the loader reads, with every optional key of each where the
# loader's key sets are otherwise only recorded when the section is present.
INSPECT_ENTRY = {
    "host": "example.org",
    "ports": [443],
    "access": "read-only",
    "mode": "report",
    "allow": [{"id": "r1", "methods": ["GET"], "paths": ["/a"], "query": {"q": True}, "headers": {"x-a": True}}],
    "deny": [{"paths": ["/b"]}],
}
SCAN = {"tier1": "deny", "tier2": "deny", "tier3": "report", "body_window_bytes": 1024}
EVERY_SECTION = {
    "version": 1,
    "defaults": {
        "mode": "enforce",
        "ports": [443],
        "literal_ips": "deny",
        "allow_cidrs": [],
        "deny_cidrs": [],
        "inspect": [{"host": "example.com", "access": "full"}],
        "scan": {"tier3": "off"},
    },
    "principals": {
        "agent": {
            "token_sha256": TOKEN_A,
            "mode": "report",
            "egress": {
                "allow_domains": ["example.org"],
                "deny_domains": [],
                "internal_hosts": [{"host": "wiki.corp.example.com", "cidrs": ["10.20.0.0/16"]}],
            },
            "tools": {"search": True, "fetch": True},
            "budgets": {"search": {"per_step": 1}, "fetch": {"per_run": 2}},
            "inspect": [INSPECT_ENTRY],
            "scan": SCAN,
        }
    },
    "fetch": {"max_redirects": 2},
    "search": {"cache_ttl_s": 10},
    "proxy": {"sni": "require"},
    "transparent": {"principals": {1000: "agent"}, "default_principal": "agent", "dns": {"denied_answer": "nxdomain"}},
    "orchestrators": {"runner": {"token_sha256": TOKEN_B, "principals": ["agent"], "max_ttl_s": 60}},
    "credentials": {
        "placeholder_key": {"env": "EGRESS_PLACEHOLDER_KEY"},
        "entries": [
            {
                "name": "gh",
                "source": {"file": "/nonexistent/gh-token"},
                "inject": {"basic": "user"},
                "bind": {
                    "hosts": ["api.github.com"],
                    "ports": [443],
                    "methods": ["GET"],
                    "paths": ["/**"],
                    "principals": ["agent"],
                },
                "require": False,
                "placeholder": {"prefix": "ghp_", "length": 40},
                "agent_env": "GH_TOKEN",
            }
        ],
    },
}

# The loader's name for a part of the file (first match) → the start of the page's heading for it.
SECTIONS = (
    (r"^policy$|^orchestrators", "Top level"),
    (r"inspect\[", "`inspect` entries"),
    (r"\.scan$", "`scan`"),
    (r"^defaults$", "`defaults`"),
    (r"^principals\.", "`principals.<name>`"),
    (r"^fetch$", "`fetch`"),
    (r"^search$", "`search`"),
    (r"^proxy$", "`proxy`"),
    (r"^transparent", "`transparent`"),
    (r"^credentials", "`credentials`"),
)


def section_for(where: str, page: dict[str, str]) -> str:
    for pattern, heading in SECTIONS:
        if re.search(pattern, where):
            return next(body for title, body in page.items() if title.startswith(heading))
    raise AssertionError(f"the loader reads a part of the file this test does not map: {where}")


def recorded_key_sets(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    original = node_reader.NodeReader.mapping

    def recording(self: Any, node: yaml.Node, where: str, allowed: set[str]) -> dict[str, yaml.Node]:
        seen.setdefault(where, set()).update(allowed)
        return original(self, node, where, allowed)

    monkeypatch.setattr(node_reader.NodeReader, "mapping", recording)
    load.parse_policy(yaml.safe_dump(EVERY_SECTION), "every-section.yaml")
    return seen


def sections(text: str) -> Iterator[tuple[str, str]]:
    """(heading, body) of each `###` section of the Keys part, and `## ...` sections after it."""
    parts = re.split(r"^(#{2,3}) (.+)$", text, flags=re.MULTILINE)
    for index in range(1, len(parts) - 2, 3):
        yield parts[index + 1].strip(), parts[index + 2]


def documents(body: str, key: str) -> bool:
    # `key`, a dotted path through it (`budgets.search`, `egress.allow_domains`, `entries[].name`),
    # or a key of a flow mapping shown in backticks (`{env: NAME}`, `{prefix: ghp_, length: 40}`).
    path = r"[\w<>\[\]]+"
    dotted = rf"`(?:{path}\.)*{re.escape(key)}(?:\[\])?(?:\.{path})*`"
    flow = rf"`\{{[^`]*\b{re.escape(key)}:[^`]*\}}`"
    return re.search(dotted, body) is not None or re.search(flow, body) is not None


def test_every_key_the_loader_accepts_is_in_its_section_of_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    page = dict(sections(PAGE.read_text(encoding="utf-8")))
    budgets_page = (ROOT / "docs" / "concepts" / "budgets.md").read_text(encoding="utf-8")
    missing = []
    for where, keys in recorded_key_sets(monkeypatch).items():
        if not keys:
            continue  # a map of names the policy chooses (principals, orchestrators, query, headers)
        body = section_for(where, page)
        if where.startswith("orchestrators"):
            body += budgets_page  # the orchestrator's keys are with the run tokens they mint
        missing += [f"{where}: {key}" for key in sorted(keys) if not documents(body, key)]
    assert missing == [], "policy keys docs/reference/policy.md does not describe:\n" + "\n".join(missing)


def test_the_check_fails_on_a_key_the_page_does_not_name() -> None:
    assert not documents("| `max_redirects` | 4 | ... |", "max_redirect_hops")
    assert documents("| `egress.allow_domains` | ... |", "allow_domains")
    assert documents("| `egress.allow_domains` | ... |", "egress")
    assert not documents("| `egress.allow_domains` | ... |", "allow")
    assert documents("| `entries[].name` | ... |", "entries")
    assert documents("`{prefix: ghp_, length: 40}`", "length")
    assert not documents("`{prefix: ghp_}` and a length", "length")
