"""Every key the policy loader accepts is documented in its section of docs/reference/policy.md.

The policy page is written by hand (its keys need more words than a table generated from the
code could give them), so it is checked against the loader instead: a policy that uses every
section is parsed with the loader's `mapping` calls recorded, which gives each section's allowed
key set exactly as the loader holds it (`version`, `defaults`, ... at the top; `egress`, `tools`,
`budgets`, ... per principal; the `fetch`/`search`/`proxy` dataclass fields). Each key must appear
in backticks in the page's section for that part of the file. Budget keys are described in the
principals section and in concepts/budgets.md.
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

# A policy touching every section the loader reads (inspection's request rules have a page of
# their own; the `inspect` key itself must still be named where it may appear).
EVERY_SECTION = {
    "version": 1,
    "defaults": {"mode": "enforce", "ports": [443], "literal_ips": "deny", "allow_cidrs": [], "deny_cidrs": []},
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
        }
    },
    "fetch": {"max_redirects": 2},
    "search": {"cache_ttl_s": 10},
    "proxy": {"sni": "require"},
    "transparent": {"principals": {1000: "agent"}, "default_principal": "agent", "dns": {"denied_answer": "nxdomain"}},
    "orchestrators": {"runner": {"token_sha256": TOKEN_B, "principals": ["agent"], "max_ttl_s": 60}},
}

# The loader's name for a part of the file → the page's heading for it.
SECTIONS = {
    "policy": "Top level",
    "defaults": "`defaults`",
    "principals.agent": "`principals.<name>`",
    "principals.agent.egress": "`principals.<name>`",
    "principals.agent.egress.internal_hosts[]": "`principals.<name>`",
    "principals.agent.tools": "`principals.<name>`",
    "principals.agent.budgets": "`principals.<name>`",
    "principals.agent.budgets.search": "`principals.<name>`",
    "principals.agent.budgets.fetch": "`principals.<name>`",
    "fetch": "`fetch`",
    "search": "`search`",
    "proxy": "`proxy`",
    "transparent": "`transparent`",
    "transparent.dns": "`transparent`",
    "orchestrators": "Top level",
    "orchestrators.runner": "Top level",
}


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
    # `key`, or a dotted path through it (`budgets.search`, `egress.allow_domains`, `dns.allow_types`).
    path = r"[\w<>\[\]]+"
    return re.search(rf"`(?:{path}\.)*{re.escape(key)}(?:\.{path})*`", body) is not None


def test_every_key_the_loader_accepts_is_in_its_section_of_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    page = dict(sections(PAGE.read_text(encoding="utf-8")))
    budgets_page = (ROOT / "docs" / "concepts" / "budgets.md").read_text(encoding="utf-8")
    missing = []
    for where, keys in recorded_key_sets(monkeypatch).items():
        if not keys:
            continue  # a map of names the policy chooses (principals, orchestrators)
        assert where in SECTIONS, f"the loader reads a part of the file this test does not map: {where}"
        body = page[SECTIONS[where]]
        if where == "orchestrators.runner":
            body += budgets_page  # the orchestrator's keys are with the run tokens they mint
        missing += [f"{where}: {key}" for key in sorted(keys) if not documents(body, key)]
    assert missing == [], "policy keys docs/reference/policy.md does not describe:\n" + "\n".join(missing)


def test_the_check_fails_on_a_key_the_page_does_not_name() -> None:
    assert not documents("| `max_redirects` | 4 | ... |", "max_redirect_hops")
    assert documents("| `egress.allow_domains` | ... |", "allow_domains")
    assert documents("| `egress.allow_domains` | ... |", "egress")
    assert not documents("| `egress.allow_domains` | ... |", "allow")
