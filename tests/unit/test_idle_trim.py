"""IdleTrim: one trim once every tool call has ended and the quiet time has passed, none before."""

from __future__ import annotations

import asyncio

from gateway.idle_trim import IdleTrim

QUIET_S = 0.05


async def test_a_burst_of_calls_is_trimmed_once_after_the_last_one_ends() -> None:
    trim = IdleTrim(QUIET_S)
    for _ in range(3):
        trim.started()
    trim.finished()
    trim.finished()
    await asyncio.sleep(QUIET_S * 3)
    assert trim.trims == 0  # one call is still in flight
    trim.finished()
    await asyncio.sleep(QUIET_S * 3)
    assert trim.trims == 1
    await asyncio.sleep(QUIET_S * 3)
    assert trim.trims == 1  # nothing ran since: no second trim


async def test_a_call_that_starts_in_the_quiet_time_postpones_the_trim() -> None:
    trim = IdleTrim(QUIET_S)
    trim.started()
    trim.finished()
    trim.started()  # before the quiet time is over
    await asyncio.sleep(QUIET_S * 3)
    assert trim.trims == 0
    trim.finished()
    await asyncio.sleep(QUIET_S * 3)
    assert trim.trims == 1


async def test_close_cancels_a_pending_trim() -> None:
    trim = IdleTrim(QUIET_S)
    trim.started()
    trim.finished()
    trim.close()
    await asyncio.sleep(QUIET_S * 3)
    assert trim.trims == 0
