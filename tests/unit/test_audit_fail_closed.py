"""The audit log under a failing destination: no partial line, refusal while failing, recovery;
rotation at a size bound; identical denials aggregated; reopen after logrotate."""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.errors import ErrorCode
from gateway.observe import metrics
from gateway.observe.audit import MAX_RETAINED_LINES, AuditLog


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _deny(audit: AuditLog, host: str = "blocked.example", **extra: Any) -> None:
    audit.decision(
        kind="connect",
        principal="agent",
        host=host,
        port=443,
        decision="deny",
        code="policy_denied",
        reason=f"{host} is not allowed",
        **extra,
    )


@contextlib.contextmanager
def file_size_limit(limit_bytes: int) -> Iterator[None]:
    """RLIMIT_FSIZE: a write past the limit is cut short, the next fails with EFBIG, as on a full disk
    (Python ignores SIGXFSZ, so the process is not killed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _failures() -> float:
    return metrics.REGISTRY.get_sample_value("egress_gateway_audit_write_failures_total") or 0.0


def test_a_write_cut_short_leaves_no_partial_line_and_refuses_until_it_can_write(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path), aggregate_s=0)
    _deny(audit, "first.example")
    size = path.stat().st_size
    before = _failures()
    with file_size_limit(size + 40):  # room for part of the next line only
        _deny(audit, "second.example")
        assert path.stat().st_size == size, "the partial line was not cut back"
        refusal = audit.refusal()
        assert refusal is not None
        assert refusal.code == ErrorCode.AUDIT_UNAVAILABLE
        assert audit.failure is not None
        assert "audit.log" in audit.failure
        assert _failures() == before + 1
        assert metrics.REGISTRY.get_sample_value("egress_gateway_audit_writable") == 0
    audit.flush()  # room again: the held line and a resume line are written
    assert audit.refusal() is None
    lines = _lines(path)
    assert [line.get("host") for line in lines[:2]] == ["first.example", "second.example"]
    assert lines[2]["event"] == "audit_resumed"
    assert lines[2]["dropped"] == 0
    audit.close()


def test_on_failure_allow_keeps_egress_open(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path), on_failure="allow", aggregate_s=0)
    _deny(audit, "first.example")
    with file_size_limit(path.stat().st_size + 10):
        _deny(audit, "second.example")
        assert audit.failure is not None
        assert audit.refusal() is None
    audit.close()


def test_a_deleted_file_is_created_again_and_an_unreachable_path_fails(tmp_path: Path) -> None:
    directory = tmp_path / "logs"
    directory.mkdir()
    path = directory / "audit.log"
    audit = AuditLog(str(path), aggregate_s=0)
    _deny(audit, "one.example")
    path.unlink()
    _deny(audit, "two.example")
    assert [line["host"] for line in _lines(path)] == ["two.example"]
    path.unlink()
    directory.rmdir()
    _deny(audit, "three.example")
    assert audit.refusal() is not None
    directory.mkdir()
    audit.flush()
    assert audit.refusal() is None
    assert [line.get("host") for line in _lines(path)][:1] == ["three.example"]
    audit.close()


def test_an_unwritable_destination_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="No such file"):
        AuditLog(str(tmp_path / "missing" / "audit.log"))


def test_the_file_rotates_at_its_size_bound_and_keeps_every_line_whole(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path), max_bytes=2000, keep_files=2, aggregate_s=0)
    for index in range(60):
        _deny(audit, f"host{index}.example")
    audit.close()
    files = sorted(tmp_path.iterdir())
    assert [file.name for file in files] == ["audit.log", "audit.log.1", "audit.log.2"]
    for file in files:
        assert file.stat().st_size <= 2000
        assert all(line["event"] == "decision" for line in _lines(file))
    # The newest lines survive; the oldest were rotated out beyond keep_files.
    assert _lines(path)[-1]["host"] == "host59.example"


async def test_identical_denials_are_written_once_then_counted(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path), aggregate_s=0.1)
    for _ in range(50):
        _deny(audit, "spam.example", client_ip="127.0.0.1")
    _deny(audit, "other.example", client_ip="127.0.0.1")  # a new kind of denial is written at once
    audit.flush()
    assert [line["host"] for line in _lines(path)] == ["spam.example", "other.example"]
    await asyncio.sleep(0.3)
    lines = _lines(path)
    repeated = [line for line in lines if line["event"] == "repeated"]
    assert len(repeated) == 1
    assert repeated[0]["host"] == "spam.example"
    assert repeated[0]["count"] == 49
    audit.close()


async def test_a_denial_is_counted_as_a_repeat_only_when_every_key_field_matches(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path), aggregate_s=10.0)
    first: dict[str, Any] = {"client_ip": "127.0.0.1", "method": "GET", "client_port": 1}
    _deny(audit, **first)
    # One key field (`audit_repeats.KEY_FIELDS`) differs in each: every one is written.
    _deny(audit, "other.example", **first)
    _deny(audit, **{**first, "client_ip": "127.0.0.2"})
    _deny(audit, **{**first, "method": "POST"})
    _deny(audit, **{key: value for key, value in first.items() if key != "method"})
    audit.decision(
        kind="http", principal="agent", host="blocked.example", port=443, decision="deny", code="policy_denied"
    )
    audit.decision(
        kind="connect", principal="bob", host="blocked.example", port=443, decision="deny", code="policy_denied"
    )
    audit.decision(
        kind="connect", principal="agent", host="blocked.example", port=80, decision="deny", code="policy_denied"
    )
    audit.decision(
        kind="connect", principal="agent", host="blocked.example", port=443, decision="deny", code="unsafe_url"
    )
    audit.flush()
    assert len(_lines(path)) == 9
    # Only fields outside the key differ (the client's port, the reason): counted, not written.
    _deny(audit, **{**first, "client_port": 2})
    audit.flush()
    assert len(_lines(path)) == 9
    audit.close()
    repeated = [line for line in _lines(path) if line["event"] == "repeated"]
    assert [(line["host"], line["count"]) for line in repeated] == [("blocked.example", 1)]


def test_reopen_writes_to_the_new_file_after_logrotate_moved_it(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path), aggregate_s=0)
    _deny(audit, "before.example")
    path.rename(tmp_path / "audit.log.1")
    audit.reopen()
    _deny(audit, "after.example")
    audit.close()
    assert [line["host"] for line in _lines(tmp_path / "audit.log.1")] == ["before.example"]
    assert [line["host"] for line in _lines(path)] == ["after.example"]


def test_lines_beyond_the_retained_bound_are_counted_while_failing_and_the_rest_written(tmp_path: Path) -> None:
    """While the destination fails, lines are held up to MAX_RETAINED_LINES, proxy lines and dict
    lines alike; newer ones are dropped and counted on the resume line."""
    directory = tmp_path / "logs"
    directory.mkdir()
    path = directory / "audit.log"
    audit = AuditLog(str(path), aggregate_s=0)
    path.unlink()
    directory.rmdir()
    extra = 7
    for index in range(MAX_RETAINED_LINES + extra):
        if index % 2:
            audit.write("probe", index=index)
        else:
            audit.write_line(b'"event":"probe","index":%d' % index, b"}\n")
    assert audit.refusal() is not None
    directory.mkdir()
    audit.flush()
    lines = _lines(path)
    assert [line["index"] for line in lines[:-1]] == list(range(MAX_RETAINED_LINES))
    assert lines[-1]["event"] == "audit_resumed"
    assert lines[-1]["dropped"] == extra
    audit.close()
