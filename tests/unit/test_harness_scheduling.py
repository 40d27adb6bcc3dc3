"""The order `make test` hands whole files to its workers (tests/harness/parallel.py): the files
that start daemons first, the quick unit and docs files last, to fill in behind them."""

from __future__ import annotations

from tests.harness.parallel import NETNS_UNIT, QuickUnitsLast, unit_of


def test_quick_units_are_handed_out_after_every_daemon_file_whatever_order_they_come_in() -> None:
    queue = QuickUnitsLast()
    for unit in ["tests/unit/a.py", "tests/integration/b.py", "tests/docs/c.py", NETNS_UNIT, "tests/unit/e.py"]:
        queue[unit] = {}
    assert list(queue) == [
        "tests/integration/b.py",
        NETNS_UNIT,
        "tests/unit/a.py",
        "tests/docs/c.py",
        "tests/unit/e.py",
    ]
    # A unit xdist puts back (a worker went away) keeps the rule.
    queue.update({"tests/chart/f.py": {}})
    assert list(queue)[2:] == ["tests/chart/f.py", "tests/unit/a.py", "tests/docs/c.py", "tests/unit/e.py"]


def test_every_network_namespace_file_is_one_unit() -> None:
    assert unit_of("tests/transparent/test_identity.py::test_x[v4]") == NETNS_UNIT
    assert unit_of("tests/integration/test_cli.py::test_y") == "tests/integration/test_cli.py"
