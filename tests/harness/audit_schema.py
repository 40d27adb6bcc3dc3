"""Validates audit lines against the schema file the gateway ships (gateway/observe/audit.schema.json).

Every harness gateway registers its audit file; the session fixture in tests/conftest.py checks
every line the suite produced, so a field added without the schema (and docs/reference/audit-log.md) fails.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import orjson

import gateway.observe

SCHEMA_PATH = Path(gateway.observe.__file__).parent / "audit.schema.json"
# Audit files removed before the session ends (the netns pods') are checked by their owners at
# teardown with `note_file`: their problems and (event, kind) pairs join the session's check.
NOTED_LINE_KINDS: set[tuple[str, str]] = set()
NOTED_PROBLEMS: list[str] = []


@cache
def validator() -> jsonschema.Draft202012Validator:
    schema = orjson.loads(SCHEMA_PATH.read_bytes())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def line_errors(line: Any) -> list[str]:
    return [
        f"{'/'.join(str(p) for p in error.path) or '<line>'}: {error.message}"
        for error in validator().iter_errors(line)
    ]


def file_errors(path: Path) -> list[str]:
    """Every problem in one audit file (and its rotated siblings): unparsable or invalid lines."""
    problems: list[str] = []
    for candidate in sorted(path.parent.glob(path.name + "*")):
        for number, raw in enumerate(candidate.read_bytes().splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                problems.append(f"{candidate}:{number}: not JSON ({exc}): {raw[:200]!r}")
                continue
            problems.extend(f"{candidate}:{number}: {error} in {raw[:300]!r}" for error in line_errors(line))
    return problems


def line_kinds(path: Path) -> set[tuple[str, str]]:
    """(event, kind) of every parsable line of one audit file and its rotated siblings."""
    kinds: set[tuple[str, str]] = set()
    for candidate in sorted(path.parent.glob(path.name + "*")) if path.parent.exists() else ():
        for raw in candidate.read_bytes().splitlines():
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(line, dict):
                kinds.add((str(line.get("event")), str(line.get("kind", ""))))
    return kinds


def note_file(path: Path) -> None:
    """Check an audit file that will be gone when the session ends; the session reports it."""
    if path.exists():
        NOTED_PROBLEMS.extend(file_errors(path))
        NOTED_LINE_KINDS.update(line_kinds(path))


def all_errors(paths: Iterable[Path]) -> list[str]:
    problems: list[str] = []
    for path in paths:
        if path.exists():
            problems.extend(file_errors(path))
    return problems
