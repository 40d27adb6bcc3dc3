"""How `make test` spreads tests over pytest-xdist workers, run for real on a small suite of its own.

The suites here are written to a temporary directory and run by a real `pytest -n 2` subprocess;
each test prints nothing, the verbose report says which worker ran it.

pytest-xdist 3.8 on pytest 9.2 ignores `xdist_group` under `--dist loadgroup` (it rewrites
`item._nodeid`, which pytest no longer reads; pytest-xdist issue 1386): the first test shows it, so
the day it fails, `tests/harness/parallel.py` may go back to groups. The second shows what the
suite relies on instead: whole files per worker, and every netns file on one worker.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS_PER_FILE = 6
RUN_TIMEOUT_S = 120
# "[gw1] [ 50%] PASSED tests/a/test_x.py::test_3" in the verbose report of a distributed run.
REPORT_LINE = re.compile(r"^\[(gw\d+)\] \[\s*\d+%\] PASSED (\S+)\s*$", re.MULTILINE)

CONFTEST = """
import pytest
from xdist.remote import Producer

from tests.harness.parallel import FileScheduling


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> FileScheduling | None:
    return FileScheduling(config, log) if config.getvalue("dist") == "loadfile" else None
"""


def _write_suite(root: Path, files: list[str], header: str = "") -> None:
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        body = "".join(f"\n{header}def test_{i}() -> None:\n    pass\n" for i in range(TESTS_PER_FILE))
        path.write_text(f"import pytest\n{body}")


def _workers_by_file(root: Path, *args: str) -> dict[str, set[str]]:
    """Run the suite in `root` on two workers; which workers ran the tests of each file."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-v", *args],
        cwd=root,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, nodeid in REPORT_LINE.findall(result.stdout):
        workers[nodeid.split("::", 1)[0].split("@", 1)[0]].add(worker)
    assert len(REPORT_LINE.findall(result.stdout)) == len(workers) * TESTS_PER_FILE, result.stdout[-3000:]
    return workers


def test_loadgroup_spreads_the_tests_of_one_xdist_group_over_workers(tmp_path: Path) -> None:
    # The dependency's bug: one group, so one worker is what xdist documents; two is what happens.
    _write_suite(tmp_path, ["test_a.py", "test_b.py"], header='@pytest.mark.xdist_group("one")\n')
    workers = _workers_by_file(tmp_path, "--dist", "loadgroup")
    assert set(workers) == {"test_a.py", "test_b.py"}
    assert len(set().union(*workers.values())) == 2, (
        "xdist_group is honoured again: tests/harness/parallel.py may use --dist loadgroup"
    )


def test_loadfile_keeps_each_file_on_one_worker_and_the_netns_files_together(tmp_path: Path) -> None:
    netns = ["tests/transparent/test_dns.py", "tests/transparent/test_tcp.py", "tests/transparent/test_rules.py"]
    others = [f"tests/integration/test_{name}.py" for name in "abcdef"]
    _write_suite(tmp_path, netns + others)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    workers = _workers_by_file(tmp_path, "--dist", "loadfile")
    assert set(workers) == set(netns + others)
    assert all(len(ran_on) == 1 for ran_on in workers.values()), workers
    assert len(set().union(*(workers[name] for name in netns))) == 1, workers
    # Both workers took part: the files were spread, not all run on one.
    assert len(set().union(*workers.values())) == 2, workers
