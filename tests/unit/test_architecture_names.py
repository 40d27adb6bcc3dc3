"""Every module, package and symbol ARCHITECTURE.md names exists (issues 27 and 30).

The document names code in backticks, relative to `gateway/`: a package (`proxy/tunnel/`), a
module (`proxy/tunnel/opener.py`), a symbol of a module (`proxy/tunnel/opener.TunnelOpener.decide`,
`errors.GatewayError`), or a class and one of its attributes (`TunnelOpener.reserve`). Each is
resolved here by importing the module and reading the attribute, so a rename that leaves the
document behind fails this test. Backticked text of any other shape (settings, headers, YAML
keys) is not code and is skipped.
"""

from __future__ import annotations

import ast
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gateway"
DOCUMENT = ROOT / "ARCHITECTURE.md"

SPAN = re.compile(r"`([^`\n]+)`")
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
PACKAGE_FORM = re.compile(r"^(?:[a-z_][a-z0-9_]*/)+$")
FILE_FORM = re.compile(r"^(?:[a-z_][a-z0-9_]*/)*[a-z_][a-z0-9_]*\.py$")
SYMBOL_FORM = re.compile(rf"^((?:[a-z_][a-z0-9_]*/)*[a-z_][a-z0-9_]*)\.({IDENT}(?:\.{IDENT})*)$")
# CamelCase with at least one lower-case letter (not an environment variable or a constant).
CLASS_FORM = re.compile(rf"^([A-Z][a-z0-9]+[A-Za-z0-9]*)(?:\.({IDENT}))?$")


def code_spans() -> list[str]:
    # Fenced drawings (the layer diagram, the layout) are checked elsewhere.
    text = re.sub(r"```.*?```", "", DOCUMENT.read_text(encoding="utf-8"), flags=re.DOTALL)
    return sorted({span for span in SPAN.findall(text)})


@cache
def classes() -> dict[str, list[str]]:
    """Every class defined in gateway/, by name: the modules defining one of that name."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(module)
    return found


def resolve(module: str, attributes: list[str]) -> None:
    value: object = importlib.import_module(module)
    for name in attributes:
        assert hasattr(value, name), f"{module} has no {'.'.join(attributes)}"
        value = getattr(value, name)


def check(span: str) -> bool:
    """Resolve `span` if it names code; False when it is not of a code shape."""
    if span.startswith(("gateway/", "tests/", "bench/")):
        # A path from the repository's root.
        assert (ROOT / span).exists(), f"no {span}"
        return True
    if PACKAGE_FORM.match(span):
        assert (PACKAGE / span / "__init__.py").is_file(), f"no package gateway/{span}"
        return True
    if FILE_FORM.match(span):
        assert (PACKAGE / span).is_file(), f"no module gateway/{span}"
        return True
    symbol = SYMBOL_FORM.match(span)
    if (symbol and "/" in symbol.group(1)) or (symbol and (PACKAGE / f"{symbol.group(1)}.py").is_file()):
        path, attributes = symbol.group(1), symbol.group(2).split(".")
        assert (PACKAGE / f"{path}.py").is_file(), f"no module gateway/{path}.py for `{span}`"
        resolve("gateway." + path.replace("/", "."), attributes)
        return True
    named_class = CLASS_FORM.match(span)
    if named_class:
        name, attribute = named_class.group(1), named_class.group(2)
        modules = classes().get(name)
        assert modules, f"no class {name} in gateway/"
        if attribute is not None:
            assert any(
                hasattr(getattr(importlib.import_module(module), name, None), attribute) for module in modules
            ), f"class {name} has no {attribute}"
        return True
    return False


@pytest.mark.parametrize("span", code_spans())
def test_each_code_name_in_architecture_exists(span: str) -> None:
    check(span)


def test_the_document_names_code_at_all() -> None:
    # The parametrized test above passes vacuously if the spans stop matching the code shapes.
    assert sum(check(span) for span in code_spans()) > 80


@pytest.mark.parametrize(
    "span",
    ["proxy/tunnel/nowhere.py", "proxy/nowhere/", "proxy/tunnel/opener.TunnelOpener.nowhere", "NoSuchClass",
     "TunnelOpener.nowhere"],
    ids=["module", "package", "method", "class", "class-attribute"],
)  # fmt: skip
def test_a_wrong_name_fails(span: str) -> None:
    with pytest.raises(AssertionError):
        check(span)
