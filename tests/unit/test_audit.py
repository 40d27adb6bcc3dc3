"""The audit log's line format and its buffering: when lines reach the file, and that none is lost."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from gateway.observe.audit import FLUSH_INTERVAL_S, MAX_PENDING_LINES, AuditLog
from gateway.observe.audit_fields import SCHEMA_VERSION


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_a_line_starts_with_time_schema_and_event_and_drops_empty_fields(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    audit.write("decision", kind="connect", principal="agent", code=None, port=443)
    audit.close()
    (line,) = _lines(path)
    assert list(line)[:3] == ["time", "schema", "event"]
    assert line["schema"] == SCHEMA_VERSION
    assert line["event"] == "decision"
    assert line["port"] == 443
    assert "code" not in line


def test_without_a_running_loop_a_line_is_written_at_once(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    audit.write("close", kind="connect")
    assert len(_lines(path)) == 1
    audit.close()


async def test_lines_written_together_leave_in_one_batch_after_the_interval(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    for index in range(5):
        audit.write_record({"ts": 1.0, "event": "close", "n": index})
    assert path.read_bytes() == b""  # held until the flush timer fires
    await asyncio.sleep(FLUSH_INTERVAL_S * 5)
    assert [line["n"] for line in _lines(path)] == [0, 1, 2, 3, 4]
    audit.close()


async def test_a_full_buffer_is_written_without_waiting_for_the_timer(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    for index in range(MAX_PENDING_LINES):
        audit.write_record({"ts": 1.0, "event": "close", "n": index})
    assert len(_lines(path)) == MAX_PENDING_LINES
    audit.close()


async def test_flush_and_close_write_what_is_buffered(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    audit.write_record({"ts": 1.0, "event": "decision", "n": 1})
    audit.flush()  # what the tools API does before answering
    assert len(_lines(path)) == 1
    audit.write_record({"ts": 1.0, "event": "close", "n": 2})
    audit.close()  # what shutdown does
    assert [line["n"] for line in _lines(path)] == [1, 2]
    await asyncio.sleep(FLUSH_INTERVAL_S * 3)  # the cancelled timer writes nothing twice
    assert len(_lines(path)) == 2


def test_off_writes_nothing(tmp_path: Path) -> None:
    audit = AuditLog("off")
    audit.write("decision", kind="fetch")
    audit.write_record({"ts": 1.0, "event": "close"})
    audit.close()
    assert list(tmp_path.iterdir()) == []
