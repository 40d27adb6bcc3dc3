"""`make run` installs only what the daemon needs; the dev tools come with `make test`/`make lint`;
`make test` runs the whole suite, `make test-fast` the unit tests only."""

from __future__ import annotations

import re
import shlex
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


def _pytest_runs(commands: str) -> list[list[str]]:
    """The arguments of each `python -m pytest` a dry run shows, in order."""
    return [shlex.split(arguments) for arguments in re.findall(r" -m pytest([^;|\n]*)", commands)]


def test_make_test_runs_the_whole_suite_in_two_parts_that_cover_it() -> None:
    # .ci/run calls `make test`: no path or keyword may narrow it; the two parts split the suite
    # by one marker and its negation, so together they are every test.
    parallel, alone = _pytest_runs(_dry_run("test"))
    # The worker count is whatever TEST_WORKERS says (`make test TEST_WORKERS=1` reaches this dry run).
    workers, count, *rest = parallel
    assert (workers, count.isdigit(), rest) == ("-n", True, ["--dist", "loadfile", "-m", "not serial"])
    assert alone == ["-m", "serial"]


def test_make_test_fast_runs_the_unit_tests_only() -> None:
    (arguments,) = _pytest_runs(_dry_run("test-fast"))
    assert arguments[0] == "tests/unit"
    assert arguments[arguments.index("-m") + 1] == "not slow"
