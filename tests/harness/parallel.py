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

It never skips, deselects or reorders a test: the same tests run as without `-n`.
"""

from __future__ import annotations

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

NETNS_DIR = "tests/transparent/"
NETNS_UNIT = "tests/transparent (network namespaces, one topology at a time)"


def unit_of(nodeid: str) -> str:
    """The work unit a test is sent in: its file, or the one netns unit."""
    path = nodeid.split("::", 1)[0]
    return NETNS_UNIT if path.startswith(NETNS_DIR) else path


class FileScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no type information
    """xdist's `loadfile` scheduling, with the netns files sent as one unit."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self.log = Producer("filesched") if log is None else log.filesched

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)
