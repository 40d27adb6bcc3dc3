"""`make run` installs only what the daemon needs; the dev tools come with `make test`/`make lint`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _dry_run(target: str) -> str:
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is not installed", pytrace=False)
    result = subprocess.run(
        [make, "-n", "-B", target], cwd=REPO, capture_output=True, text=True, timeout=30, check=True
    )
    return result.stdout


def test_make_run_installs_the_runtime_dependencies_only() -> None:
    commands = _dry_run("run")
    assert "pip install -q -e .\n" in commands
    assert "[dev]" not in commands
    assert "egress-gateway serve" in commands


def test_make_test_installs_the_dev_dependencies() -> None:
    assert "pip install -q -e '.[dev]'" in _dry_run("test")
