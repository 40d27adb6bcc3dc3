"""Helpers shared by test modules live in tests/harness/, never in another test module.

Importing a test module from another one runs its module code a second time under another name
and hides a helper where nobody looks for one; `make test` also sends each file to its own
pytest-xdist worker, so a test module is no place for state two files share.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TEST_MODULE = re.compile(r"^tests(\.\w+)*\.test_\w+$")


def test_no_test_module_imports_another_test_module() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            offenders += [f"{path.relative_to(TESTS.parent)}: {name}" for name in names if TEST_MODULE.match(name)]
    assert offenders == [], "move the helper into tests/harness/: " + "; ".join(offenders)
