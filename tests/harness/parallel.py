"""Which tests must share one pytest-xdist worker, decided once at collection.

`make test` runs the suite on several workers with `--dist loadgroup`: a test is sent to any
worker unless it carries `xdist_group`, and every test of one group runs on the same worker, one
after another. `mark_worker_groups`, called by the root conftest at collection, adds that mark
where a test is not free to go anywhere:

- a test that uses a module-scoped fixture (a shared gateway, a Sentinel group, a netns pod) is
  grouped with its module, so the fixture is built once and not once per worker;
- every test under `tests/transparent/` joins the group `netns`: the namespaces and their
  `/etc/netns` entries are made and removed one topology at a time;
- a module may name its own group with `pytestmark = pytest.mark.xdist_group("...")` (for
  example the Redis topologies, which are session fixtures too costly to build on every worker);
  a mark already there is kept.

It never skips, deselects or reorders a test: `make test` runs every test either way, and a
plain `pytest` (no `-n`) ignores the marks. `plain_nodeid` undoes the `@group` suffix xdist appends to
a grouped test's id, for the session checks that name tests by id.
"""

from __future__ import annotations

import re

import pytest

NETNS_DIR = "tests/transparent/"
NETNS_GROUP = "netns"
# Scopes wider than a test and narrower than the session: their fixtures live as long as one
# module (or class, or package), so the tests that share them must share a worker too.
SHARED_SCOPES = frozenset({"class", "module", "package"})
# xdist appends "@<group>" to the id of a grouped test; a parametrized id ends with "]" instead.
_GROUP_SUFFIX = re.compile(r"@[\w.\-/]+$")


def plain_nodeid(nodeid: str) -> str:
    """A test's id as written without xdist: `tests/x.py::test_y` for `tests/x.py::test_y@group`."""
    return _GROUP_SUFFIX.sub("", nodeid)


def group_of(item: pytest.Item) -> str | None:
    """The xdist group this test must join, or None when any worker may run it."""
    nodeid = item.nodeid
    if nodeid.startswith(NETNS_DIR):
        return NETNS_GROUP
    fixture_info = getattr(item, "_fixtureinfo", None)
    if fixture_info is None:
        return None
    for name in fixture_info.names_closure:
        definitions = fixture_info.name2fixturedefs.get(name, ())
        if definitions and definitions[-1].scope in SHARED_SCOPES:
            return nodeid.split("::", 1)[0]
    return None


def mark_worker_groups(items: list[pytest.Item]) -> None:
    """Add `xdist_group` to every collected test that must share a worker (the root conftest
    calls this from its collection hook, before xdist reads the marks)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
