"""Every top-level key of the chart's values.yaml is named on the Helm values page.

The page is the short form of values.yaml, written by hand; a new top-level key (a new feature's
switch) must get a row there. Keys below the top level are checked where the page promises a
row per key (`transparent.*`, `networkPolicy.*`, `metrics.*`, `shutdown.*`).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "helm" / "egress-gateway" / "values.yaml"
PAGE = ROOT / "docs" / "reference" / "helm-values.md"
DETAILED = ("transparent", "networkPolicy", "metrics", "shutdown")


def named(page: str, key: str) -> bool:
    # `key`, `parent.key`, `key.child`, or `key` after a slash in a row naming several keys.
    return re.search(rf"`(?:[\w.*]+\.)?{re.escape(key)}(?:[`.* ])", page) is not None


def test_every_top_level_value_has_a_row() -> None:
    values = yaml.safe_load(VALUES.read_text(encoding="utf-8"))
    page = PAGE.read_text(encoding="utf-8")
    missing = [key for key in values if not named(page, key)]
    missing += [
        f"{key}.{sub}" for key in DETAILED for sub in values[key] if not named(page, sub) and f"`{sub}`" not in page
    ]
    assert missing == [], f"values.yaml keys docs/reference/helm-values.md does not name: {missing}"
