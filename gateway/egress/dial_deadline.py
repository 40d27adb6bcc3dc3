"""The per-attempt timeout of a pinned dial: the protocol a `PinnedDial`'s caller's timer implements.

`PinnedDial` bounds each address it tries through a `DialDeadline`, which knows how long an
attempt may take (the proxy: the policy's `connect_timeout_s`) and which the caller already keeps
for the connection being served (the proxy: one entry per client connection on its listener's
deadline wheel), so no timer is armed per dial. When an attempt's time passes, the deadline calls
the dial's `attempt_timed_out`, which ends that attempt as timed out and goes on to the next
address. Callers without such a deadline run in a task of their own and use
`open_pinned_connection`, whose loop timer cancels that task.

Never dials, never decides what a timeout means to the caller (the dialer turns it into
`connect_failure`).
"""

from __future__ import annotations

from typing import Protocol


class DialDeadline(Protocol):
    """Bounds one attempt at a time of a dial."""

    def start_dial_attempt(self) -> None:
        """An attempt starts now: call the dial's `attempt_timed_out` if it still runs once the
        time an attempt may take has passed."""
        ...

    def end_dial_attempt(self) -> None:
        """The attempt ended (connected, failed or cancelled): nothing is due any more."""
        ...
