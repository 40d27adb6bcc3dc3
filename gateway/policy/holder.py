"""The policy in force and its reload: the current `LoadedPolicy`, kept when a reload fails.

A reload only ever enforces a complete file. The file is meant to be replaced atomically
(write a temporary file, then rename it over the policy; a Kubernetes ConfigMap mount swaps a
`..data` symlink, which the path follows): the watcher notices a new (mtime, size, inode) of the
file the path resolves to, waits until that stamp has held for one more poll (a burst of change
events is one reload), and a file whose stamp changed while it was read is refused and read
again on the next poll. Content identical to the policy in force (a `touch`, a SIGHUP, a
ConfigMap resync) keeps the generation, so in-flight tool calls are not dropped with
`policy_changed`. Every reload that changes the content gets the next generation number.
Parsing is `load.py`'s; this module only reads the file and swaps.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from gateway.policy.load import PolicyError, parse_policy
from gateway.policy.model import LoadedPolicy

log = logging.getLogger("egress_gateway.policy")

FileStamp = tuple[float, int, int]
START_READ_ATTEMPTS = 3


class PolicyFileChanging(Exception):
    """The file changed while it was read: not a policy error, read it again later."""


class FixedPolicy:
    """A policy that is never reloaded (a one-shot command): what `EgressCore` reads as `current`."""

    __slots__ = ("current",)

    def __init__(self, loaded: LoadedPolicy) -> None:
        self.current = loaded


class PolicyHolder:
    """The current policy and its generation; reloads from the file, keeping the last good one."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        on_reload: Callable[[bool, int], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self._on_reload = on_reload
        for attempt in range(START_READ_ATTEMPTS):
            try:
                text, self._stamp, self._digest = self._read_whole()
                break
            except PolicyFileChanging:
                if attempt == START_READ_ATTEMPTS - 1:
                    raise PolicyError([f"{self.path}:0: the policy file kept changing while it was read"]) from None
        # An attribute, not a property: the proxy reads it on every request (`EgressCore.policy`).
        self.current = LoadedPolicy(parse_policy(text, str(self.path)), 1)
        self._pending: FileStamp | None = None

    @property
    def digest(self) -> str:
        """SHA-256 of the policy text in force."""
        return self._digest

    def file_present(self) -> bool:
        return self._file_stamp() is not None

    def _file_stamp(self) -> FileStamp | None:
        try:
            st = self.path.stat()  # follows symlinks: a ConfigMap's ..data swap changes the inode
        except OSError:
            return None
        return (st.st_mtime, st.st_size, st.st_ino)

    def _read_whole(self) -> tuple[str, FileStamp | None, str]:
        """The file's text, read between two equal stamps, or PolicyError / PolicyFileChanging."""
        before = self._file_stamp()
        try:
            data = self.path.read_bytes()
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError(
                [f"{self.path}:0: cannot read the policy file ({exc.__class__.__name__}: {exc})"]
            ) from None
        after = self._file_stamp()
        if before != after or (after is not None and after[1] != len(data)):
            raise PolicyFileChanging(f"{self.path} changed while it was read")
        return text, after, hashlib.sha256(data).hexdigest()

    def poll(self) -> bool:
        """One watcher tick: reload once a changed stamp has held since the previous tick."""
        stamp = self._file_stamp()
        if stamp == self._stamp:
            self._pending = None
            return False
        if stamp != self._pending:
            # Debounce: an editor's or a deployer's burst of writes settles before it is read.
            self._pending = stamp
            return False
        self._pending = None
        return self.reload()

    def reload(self) -> bool:
        """Load the file again. On failure keep the last good policy and report False."""
        try:
            text, stamp, digest = self._read_whole()
        except PolicyFileChanging as exc:
            # Not a failed reload: the next tick reads the settled file.
            log.warning("policy reload postponed: %s", exc)
            self._pending = None
            return False
        except PolicyError as exc:
            return self._failed(exc)
        self._stamp = stamp
        if digest == self._digest:
            log.info("policy file unchanged (sha256 %s), generation %d kept", digest[:12], self.current.generation)
            if self._on_reload:
                self._on_reload(True, self.current.generation)
            return True
        try:
            policy = parse_policy(text, str(self.path))
        except PolicyError as exc:
            return self._failed(exc)
        self._digest = digest
        self.current = LoadedPolicy(policy, self.current.generation + 1)
        log.info("policy reloaded from %s, generation %d", self.path, self.current.generation)
        if self._on_reload:
            self._on_reload(True, self.current.generation)
        return True

    def _failed(self, exc: PolicyError) -> bool:
        self._stamp = self._file_stamp()
        log.error("policy reload failed, keeping generation %d: %s", self.current.generation, exc)
        if self._on_reload:
            self._on_reload(False, self.current.generation)
        return False
