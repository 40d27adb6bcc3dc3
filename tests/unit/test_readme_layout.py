"""The layout page (docs/development/architecture.md) names every module of the package, under its own package's entry.

The drawing is what a new reader trusts to find their way; a module added without a line there
is invisible to them, so the tree and the drawing are compared on every run.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gateway"
ENTRY = re.compile(r"^  (\S+)")
WILDCARD = re.compile(r"(\w+)\*")


def layout_entries() -> dict[str, str]:
    """Each top-level entry of the layout drawing (a package `name/` or root file names), with the
    text of its lines."""
    text = (ROOT / "docs" / "development" / "architecture.md").read_text(encoding="utf-8")
    block = text[text.index("```\ngateway/\n") : text.index("\ntests/\n")]
    entries: dict[str, str] = {}
    current = ""
    for line in block.splitlines()[2:]:
        match = ENTRY.match(line)
        if match:
            current = match.group(1).rstrip(",")
            entries[current] = ""
        entries[current] += line + "\n"
    return entries


def is_named(stem: str, text: str) -> bool:
    if re.search(rf"\b{re.escape(stem)}\b", text):
        return True
    return any(stem.startswith(prefix) for prefix in WILDCARD.findall(text))


def test_every_module_is_named_under_its_package() -> None:
    entries = layout_entries()
    root_text = "".join(text for name, text in entries.items() if not name.endswith("/"))
    missing = []
    for module in sorted(PACKAGE.rglob("*.py")):
        if module.stem == "__init__":
            continue
        parts = module.relative_to(PACKAGE).parts
        text = root_text if len(parts) == 1 else entries.get(parts[0] + "/", "")
        if not is_named(module.stem, text):
            missing.append("/".join(parts))
    assert not missing, f"modules docs/development/architecture.md does not name: {missing}"


def test_every_package_entry_is_a_package() -> None:
    packages = {name for name in layout_entries() if name.endswith("/")}
    on_disk = {path.name + "/" for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert packages == on_disk
