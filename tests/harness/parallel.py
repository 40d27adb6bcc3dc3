"""How `make test` spreads the suite over pytest-xdist workers: whole files, netns files together.

`make test` runs `pytest -n N --dist loadfile`. Under it, the root conftest hands xdist the
scheduler here, which sends whole test files to a worker, so a module-scoped fixture (a shared
gateway, a Sentinel group, a Redis Cluster, a netns pod) is built once, on one worker; and which
sends every file under `tests/transparent/` as one unit, so one topology of network namespaces
(and its `/etc/netns` entry) is made and removed at a time.

Why not `--dist loadgroup` with `xdist_group` marks: pytest-xdist 3.8 tags a grouped test by
rewriting `item._nodeid`, which pytest 9.2 no longer reads (node ids became structured), so the
marks are silently ignored and grouped tests spread over every worker (pytest-xdist issue 1386;
tests/integration/test_parallel_scheduling.py shows it). The scheduler below reads nothing but node ids.

Which files go first: xdist hands out the files with the most tests first, and the files of few
tests are the slow ones here (each test starts a gateway), so a worker would pick up a 60 s file
at the very end while the others idle. The quick files (`tests/unit/`, `tests/docs/`: no daemon,
many tests) are handed out last instead, filling in behind the daemon files.

It never skips, deselects or reorders a test within a file: the same tests run as without `-n`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

NETNS_DIR = "tests/transparent/"
NETNS_UNIT = "tests/transparent (network namespaces, one topology at a time)"
QUICK_DIRS = ("tests/unit/", "tests/docs/")


def unit_of(nodeid: str) -> str:
    """The work unit a test is sent in: its file, or the one netns unit."""
    path = nodeid.split("::", 1)[0]
    return NETNS_UNIT if path.startswith(NETNS_DIR) else path


def is_quick(unit: str) -> bool:
    """A work unit of quick tests (no daemon), handed out after the others."""
    return unit.startswith(QUICK_DIRS)


class QuickUnitsLast(OrderedDict[str, Any]):
    """xdist's work queue, in the order it fills it (most tests first), with the quick units
    kept behind every other unit."""

    def __setitem__(self, unit: str, tests: Any) -> None:
        super().__setitem__(unit, tests)
        if not is_quick(unit):
            for quick in [key for key in self if is_quick(key)]:
                self.move_to_end(quick)


class FileScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no type information
    """xdist's `loadfile` scheduling, with the netns files sent as one unit."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self.log = Producer("filesched") if log is None else log.filesched
        self.workqueue = QuickUnitsLast()

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)
