"""Every route the tools API and the admin listener register is on the HTTP API page, with its
method: read from the `router.add_*` calls in the package (the one place routes are declared),
so an endpoint cannot be added without its row."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gateway"
PAGE = ROOT / "docs" / "reference" / "http-api.md"
METHODS = {"add_get": "GET", "add_post": "POST"}


def module_constants(tree: ast.Module) -> dict[str, str]:
    return {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def registered_routes() -> set[tuple[str, str]]:
    routes = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = module_constants(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            receiver = node.func.value
            if not (isinstance(receiver, ast.Attribute) and receiver.attr == "router"):
                continue
            if node.func.attr not in METHODS or not node.args:
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                routes.add((METHODS[node.func.attr], first.value))
            elif isinstance(first, ast.Name) and first.id in constants:
                routes.add((METHODS[node.func.attr], constants[first.id]))
    return routes


def test_every_registered_route_is_on_the_http_api_page() -> None:
    routes = registered_routes()
    assert ("POST", "/v1/fetch") in routes  # the reader of the package still finds the routes
    page = PAGE.read_text(encoding="utf-8")
    missing = sorted(f"{method} {path}" for method, path in routes if f"`{method} {path}" not in page)
    assert missing == [], f"routes docs/reference/http-api.md does not list: {missing}"
