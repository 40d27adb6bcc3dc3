"""How many examples a property test runs: bounded in `make test`, many more in `make fuzz`.

`make fuzz` sets EGRESS_FUZZ_SCALE (a whole number multiplying every test's own count); every
property module asks `examples(n)` for its settings, so one knob lengthens them all.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

FUZZ_SCALE = max(1, int(os.environ.get("EGRESS_FUZZ_SCALE", "1") or "1"))


def examples(count: int) -> settings:
    """Settings for `count` examples (times the fuzz scale), no deadline, no example database."""
    return settings(
        max_examples=count * FUZZ_SCALE,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
