"""The harness reads a live audit log by whole lines (tests/harness/audit_file.py).

A read can land while the gateway is part-way through a write: a test failed with
`JSONDecodeError: unexpected end of data` on such a read (test_proxy_kept_decision, 6efcc74).
"""

from __future__ import annotations

from pathlib import Path

from tests.harness.audit_file import audit_records, whole_lines


def test_a_line_being_written_is_left_for_the_next_read(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_bytes(b'{"event":"decision"}\n{"event":"close","by')
    assert audit_records(path) == [{"event": "decision"}]
    with path.open("ab") as audit:
        audit.write(b'tes_up":0}\n')
    assert audit_records(path, since=1) == [{"event": "close", "bytes_up": 0}]


def test_no_file_yet_is_no_lines(tmp_path: Path) -> None:
    assert whole_lines(tmp_path / "audit.log") == []
