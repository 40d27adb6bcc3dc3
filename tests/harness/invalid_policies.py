"""Invalid policy fixtures: one small file per mistake, each with the first error it must raise.

A table (fixture file name → line and message of its first error) is checked two ways: the
folder holds exactly the table's files (a fixture nobody expects, or an expectation with no
file, fails), and each file fails to load with `file:line: message`. The policy loader and the
`inspect` rules' loader keep their fixtures in folders of their own and share these checks.
Never writes a fixture.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from gateway.policy.load import PolicyError, load_policy_file

POLICY_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "policies"

# fixture file name → (line, message) of the first error its load raises
ExpectedErrors = Mapping[str, tuple[int, str]]


def invalid_fixture_cases(expected: ExpectedErrors) -> list[pytest.ParameterSet]:
    """One `(name, line, message)` case per fixture, with an id that reads as the mistake."""
    return [
        pytest.param(name, line, message, id=name.removesuffix(".yaml").replace("_", "-"))
        for name, (line, message) in expected.items()
    ]


def assert_fixtures_are_expected(folder: Path, expected: ExpectedErrors) -> None:
    """The folder's fixtures are exactly the table's: each file has its message and vice versa."""
    assert sorted(path.name for path in folder.glob("*.yaml")) == sorted(expected)


def assert_first_error_at(path: Path, line: int, message: str) -> None:
    """Loading `path` fails, and its first error names the file, the line and the message."""
    with pytest.raises(PolicyError) as caught:
        load_policy_file(path)
    first = caught.value.errors[0]
    assert first.startswith(f"{path}:{line}: "), first
    assert message in first
