"""Where audit bytes land: stdout or a file, written whole or not at all, rotated at a size bound.

Owns the file descriptor of the audit destination: opening it at start (an unwritable path is an
OSError the daemon turns into a start-up failure), writing one batch of complete lines, cutting
back whatever part of a batch a failed write left behind (disk full, file size limit), noticing
that the file was removed under it, reopening on request (logrotate's `postrotate`), and rotating
`audit.log` → `audit.log.1` … when a size bound is set.

Never formats a line, never decides what to do about a failure (audit.py does): it raises OSError.
"""

from __future__ import annotations

import contextlib
import os
import sys

FILE_MODE = 0o640


class AuditSink:
    """One audit destination: `-` (stdout) or a file path."""

    def __init__(self, destination: str, *, max_bytes: int = 0, keep_files: int = 1) -> None:
        self.destination = destination
        self.max_bytes = max_bytes
        self.keep_files = max(1, keep_files)
        self._is_file = destination != "-"
        self._fd = self._open() if self._is_file else sys.stdout.fileno()
        self._size = self._current_size()

    def _open(self) -> int:
        return os.open(self.destination, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)

    def _current_size(self) -> int:
        if not self._is_file:
            return 0
        return os.fstat(self._fd).st_size

    def write(self, data: bytes) -> None:
        """Append `data` (complete lines) or raise OSError leaving the file as it was."""
        if self._is_file:
            self._ensure_linked()
            if self.max_bytes and self._size and self._size + len(data) > self.max_bytes:
                self.rotate()
        start = self._size
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                # A short write (a pipe, a signal): the rest, without copying what is left.
                view = memoryview(data)[written:]
                while view:
                    written = os.write(self._fd, view)
                    if written <= 0:
                        raise OSError("the audit destination accepted no bytes")
                    view = view[written:]
        except OSError:
            # A partial line would break every JSON-lines reader after it: cut back to the last
            # complete line (a pipe cannot be cut; a failed write to one is whole or nothing).
            if self._is_file:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, start)
            raise
        self._size = start + len(data)

    def _ensure_linked(self) -> None:
        """A file deleted under us still takes writes, into an inode nobody can read: reopen the
        path, or fail if it cannot be created again."""
        if os.fstat(self._fd).st_nlink == 0:
            self.reopen()

    def reopen(self) -> None:
        """Open the path afresh (after logrotate moved it); keeps the old descriptor on failure."""
        if not self._is_file:
            return
        fd = self._open()
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = fd
        self._size = self._current_size()

    def rotate(self) -> None:
        """`path` → `path.1` → … → `path.<keep_files>` (the oldest is replaced), then a new `path`."""
        for index in range(self.keep_files - 1, 0, -1):
            older = f"{self.destination}.{index}"
            if os.path.exists(older):
                os.replace(older, f"{self.destination}.{index + 1}")
        os.replace(self.destination, f"{self.destination}.1")
        self.reopen()

    def close(self) -> None:
        if self._is_file:
            with contextlib.suppress(OSError):
                os.close(self._fd)
