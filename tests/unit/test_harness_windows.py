"""The harness's window helper waits only when a test's calls would cross a minute's end."""

from __future__ import annotations

import pytest

from tests.harness.windows import wait_for_room_s


@pytest.mark.parametrize(
    ("now", "needed_s", "expected_s"),
    [(600.0, 10.0, 0.0), (649.9, 10.0, 0.0), (655.0, 10.0, 5.05), (659.99, 1.0, 0.06), (61.0, 59.0, 0.0)],
)
def test_waits_past_the_minute_end_only_when_too_little_of_it_is_left(
    now: float, needed_s: float, expected_s: float
) -> None:
    assert wait_for_room_s(needed_s, lambda: now) == pytest.approx(expected_s)
