"""The lock-free loop metrics export exactly what prometheus_client's own would, for the same updates."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.observe.loop_metrics import LoopCounter, LoopHistogram

BUCKETS = (0.0005, 0.001, 0.01, 0.1, 1.0, 10.0)
# Values on, between, below and above the bounds, and zero.
VALUES = (0.0, 0.0001, 0.0005, 0.0007, 0.001, 0.05, 0.1, 0.5, 1.0, 9.99, 10.0, 10.01, 3600.0)


def _exposition(registry: CollectorRegistry) -> list[str]:
    # prometheus_client's own metrics add `_created` timestamps, which the loop metrics leave out.
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_a_labelled_counter_exports_like_prometheus_clients() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopCounter("t_decisions_total", "Decisions.", ["kind", "code"], registry=ours)
    reference = Counter("t_decisions_total", "Decisions.", ["kind", "code"], registry=theirs)
    for kind, code, amount in (("connect", "", 1), ("http", "policy_denied", 2), ("connect", "", 3.5)):
        loop.labels(kind, code).inc(amount)
        reference.labels(kind, code).inc(amount)
    loop.labels(kind="fetch", code="ok").inc()
    reference.labels(kind="fetch", code="ok").inc()
    assert _exposition(ours) == _exposition(theirs)


@pytest.mark.parametrize("labelled", [False, True])
def test_a_histogram_exports_like_prometheus_clients(labelled: bool) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    labels = ["kind"] if labelled else []
    loop = LoopHistogram("t_seconds", "Seconds.", labels, buckets=BUCKETS, registry=ours)
    reference = Histogram("t_seconds", "Seconds.", labels, buckets=BUCKETS, registry=theirs)
    assert _exposition(ours) == _exposition(theirs)  # before any observation too
    for value in VALUES:
        if labelled:
            loop.labels("connect").observe(value)
            reference.labels("connect").observe(value)
        else:
            loop.observe(value)
            reference.observe(value)
    assert _exposition(ours) == _exposition(theirs)


def test_labels_must_match_the_declared_names() -> None:
    registry = CollectorRegistry()
    counter = LoopCounter("t_total", "T.", ["direction"], registry=registry)
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels("up", "down")
    histogram = LoopHistogram("t_seconds", "T.", ["kind"], buckets=BUCKETS, registry=registry)
    with pytest.raises(ValueError, match="observe through labels"):
        histogram.observe(1.0)
