"""Policy reload enforces only complete files (issue 12): atomic replace, debounce, a file caught
mid-write refused, unchanged content keeps the generation. Real files in a temporary directory."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from gateway.policy.holder import PolicyHolder

FETCH_ON = "version: 1\nprincipals: {default: {tools: {fetch: true}}}\n"
SEARCH_ON = "version: 1\nprincipals: {default: {tools: {search: true}}}\n"
BOTH_ON = "version: 1\nprincipals: {default: {tools: {search: true, fetch: true}}}\n"


class Recorder:
    def __init__(self) -> None:
        self.outcomes: list[tuple[bool, int]] = []

    def __call__(self, ok: bool, generation: int) -> None:
        self.outcomes.append((ok, generation))


def replace_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_unchanged_content_keeps_the_generation(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(FETCH_ON)
    recorder = Recorder()
    holder = PolicyHolder(path, on_reload=recorder)
    replace_atomically(path, FETCH_ON)  # a touch, a ConfigMap resync, a deployer rewriting it
    os.utime(path, (1, 1))
    assert holder.reload() is True
    assert holder.current.generation == 1
    assert recorder.outcomes == [(True, 1)]


def test_write_then_rename_is_reloaded_after_one_quiet_poll(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(FETCH_ON)
    holder = PolicyHolder(path)
    assert holder.poll() is False
    replace_atomically(path, SEARCH_ON)
    assert holder.poll() is False  # seen, not yet read: the change must hold for one more poll
    assert holder.current.generation == 1
    assert holder.poll() is True
    assert holder.current.generation == 2
    assert holder.current.policy.principals["default"].tools.search


def test_a_burst_of_changes_is_one_reload_of_the_last_content(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(FETCH_ON)
    recorder = Recorder()
    holder = PolicyHolder(path, on_reload=recorder)
    replace_atomically(path, SEARCH_ON)
    assert holder.poll() is False
    replace_atomically(path, BOTH_ON)  # changed again before the next poll: wait again
    assert holder.poll() is False
    assert holder.poll() is True
    assert recorder.outcomes == [(True, 2)]
    tools = holder.current.policy.principals["default"].tools
    assert (tools.search, tools.fetch) == (True, True)


def test_a_configmap_symlink_swap_is_followed(tmp_path: Path) -> None:
    # The layout kubelet writes: policy.yaml → ..data/policy.yaml, ..data → ..<timestamp>/.
    first, second = tmp_path / "..2026_12_01_a", tmp_path / "..2026_12_01_b"
    first.mkdir()
    second.mkdir()
    (first / "policy.yaml").write_text(FETCH_ON)
    (second / "policy.yaml").write_text(SEARCH_ON)
    (tmp_path / "..data").symlink_to(first.name)
    path = tmp_path / "policy.yaml"
    path.symlink_to("..data/policy.yaml")
    holder = PolicyHolder(path)
    swap = tmp_path / "..data_tmp"
    swap.symlink_to(second.name)
    os.replace(swap, tmp_path / "..data")  # the atomic swap
    assert holder.poll() is False
    assert holder.poll() is True
    assert holder.current.generation == 2
    assert holder.current.policy.principals["default"].tools.search


def test_a_file_that_changes_while_it_is_read_is_refused_without_counting_a_failure(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(FETCH_ON)
    recorder = Recorder()
    holder = PolicyHolder(path, on_reload=recorder)
    # A FIFO in the file's place: what a read returns is not what stat said was there, the way a
    # file being written is not. The writer hands over a policy that parses.
    path.unlink()
    os.mkfifo(path)
    writer = threading.Thread(target=lambda: path.write_text(SEARCH_ON), name="fifo-writer")
    writer.start()
    try:
        assert holder.reload() is False
    finally:
        writer.join(5)
    assert holder.current.generation == 1
    assert holder.current.policy.principals["default"].tools.fetch
    assert recorder.outcomes == []  # postponed, not failed: the next poll reads the settled file
    path.unlink()
    path.write_text(SEARCH_ON)
    assert holder.poll() is False
    assert holder.poll() is True
    assert holder.current.generation == 2


def test_a_removed_policy_file_is_reported_and_the_last_good_policy_stays(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(FETCH_ON)
    holder = PolicyHolder(path)
    assert holder.file_present()
    path.unlink()
    assert not holder.file_present()
    assert holder.reload() is False
    assert holder.current.policy.principals["default"].tools.fetch
