"""A live gateway's audit log as the tests read it: whole lines only.

Owns reading the file while the gateway may be writing it: a read can land part-way through a
write, so the bytes after the last newline (the line being written) are left for the next read
instead of failing to parse. No tests live here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


def whole_lines(path: Path) -> list[bytes]:
    """The audit file's complete lines (none when it does not exist yet)."""
    if not path.exists():
        return []
    written = path.read_bytes()
    return written[: written.rfind(b"\n") + 1].splitlines()


def audit_records(path: Path, since: int = 0) -> list[dict[str, Any]]:
    """The complete lines from line `since` on, parsed."""
    return [orjson.loads(line) for line in whole_lines(path)[since:] if line.strip()]
