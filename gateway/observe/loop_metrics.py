"""Counters and histograms for the event loop's hot paths, kept without prometheus_client's locks.

prometheus_client's metrics take a lock on every update so that threads can share them, and a
histogram walks its buckets in Python. The proxy updates a handful of metrics per tunnel and per
request, only ever on the event loop's thread, and measured that way those updates were about a
tenth of the Python a tunnel costs (callgrind). These keep plain numbers and hand them to
prometheus_client as metric families when the registry is scraped, through a collector (the
library's own extension point), so the exposition is the library's.

Update and scrape them from the event loop's thread only (the admin server scrapes on it).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import cast

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# The library's own `le` formatting (it carries no type hints).
_format_bound = cast(Callable[[float], str], floatToGoString)


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        # The first bound >= amount is the `le` bucket the value belongs to.
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount


class _LoopMetric(Collector):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        registry.register(self)

    def _key(self, values: tuple[str, ...], named: dict[str, str]) -> tuple[str, ...]:
        if named:
            values = tuple(named[label] for label in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        return tuple(str(value) for value in values)

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def _family(self) -> Metric:
        raise NotImplementedError

    def collect(self) -> Iterable[Metric]:
        raise NotImplementedError


class LoopCounter(_LoopMetric):
    """A counter family (`name` ends in `_total`), updated through `labels(...).inc()`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self._children: dict[tuple[str, ...], CounterChild] = {}
        super().__init__(name, documentation, labelnames, registry)

    def labels(self, *values: str, **named: str) -> CounterChild:
        key = self._key(values, named)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = CounterChild()
        return child

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for key, child in self._children.items():
            family.add_metric(list(key), child.value)
        return [family]


class LoopHistogram(_LoopMetric):
    """A histogram family: `observe()` directly without labels, else `labels(...).observe()`."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._bounds = tuple(float(bound) for bound in buckets)
        self._bound_texts = tuple(_format_bound(bound) for bound in (*self._bounds, float("inf")))
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        super().__init__(name, documentation, labelnames, registry)
        # Like prometheus_client, an unlabelled histogram is exported (at zero) from the start.
        self._unlabelled = self.labels() if not self.labelnames else None
        # `observe()` is the unlabelled child's own: one Python call per observation, not two.
        self.observe: Callable[[float], None] = (
            self._unlabelled.observe if self._unlabelled is not None else self._observe_labelled
        )

    def labels(self, *values: str, **named: str) -> HistogramChild:
        key = self._key(values, named)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = HistogramChild(self._bounds)
        return child

    def _observe_labelled(self, amount: float) -> None:
        raise ValueError(f"{self.name} has labels {self.labelnames}: observe through labels()")

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for key, child in self._children.items():
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for text, count in zip(self._bound_texts, child.counts, strict=True):
                cumulative += count
                buckets.append((text, cumulative))
            family.add_metric(list(key), buckets, child.sum)
        return [family]
