"""The policy in force and its reload: the current `LoadedPolicy`, kept when a reload fails.

Every successful load gets the next generation number, which tool calls compare to notice a
policy change mid-flight. Parsing is `load.py`'s; this module only reads the file and swaps.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from gateway.policy.load import PolicyError, load_policy_file
from gateway.policy.model import LoadedPolicy

log = logging.getLogger("egress_gateway.policy")


class PolicyHolder:
    """The current policy and its generation; reloads from the file, keeping the last good one."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        on_reload: Callable[[bool, int], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self._on_reload = on_reload
        self._loaded = LoadedPolicy(load_policy_file(self.path), 1)
        self._stamp = self._file_stamp()

    @property
    def current(self) -> LoadedPolicy:
        return self._loaded

    def _file_stamp(self) -> tuple[float, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime, st.st_size, st.st_ino)

    def changed_on_disk(self) -> bool:
        return self._file_stamp() != self._stamp

    def reload(self) -> bool:
        """Load the file again. On failure keep the last good policy and report False."""
        self._stamp = self._file_stamp()
        try:
            policy = load_policy_file(self.path)
        except PolicyError as exc:
            log.error("policy reload failed, keeping generation %d: %s", self._loaded.generation, exc)
            if self._on_reload:
                self._on_reload(False, self._loaded.generation)
            return False
        self._loaded = LoadedPolicy(policy, self._loaded.generation + 1)
        log.info("policy reloaded from %s, generation %d", self.path, self._loaded.generation)
        if self._on_reload:
            self._on_reload(True, self._loaded.generation)
        return True
