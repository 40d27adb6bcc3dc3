"""Budgets and shared state: reservations, concurrency leases, cooldowns and a small cache.

One protocol (`BudgetStore`, in `store.py`) with two implementations: `MemoryBudgetStore` for a
single process (the default) and `RedisBudgetStore` shared by replicas when `EGRESS_REDIS_URL` is
set. `open_store` picks one; nothing else in the gateway names an implementation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.budget.memory import MemoryBudgetStore
from gateway.budget.model import BudgetCounts, Reservation, ToolLimits
from gateway.budget.store import BudgetStore
from gateway.errors import ErrorCode, GatewayError

if TYPE_CHECKING:
    from gateway.budget.redis import RedisBudgetStore

__all__ = [
    "BudgetCounts",
    "BudgetStore",
    "MemoryBudgetStore",
    "RedisBudgetStore",
    "Reservation",
    "ToolLimits",
    "open_store",
]


def __getattr__(name: str) -> Any:
    # redis-py costs ~7 MB PSS in every pod: it is imported only when Redis is configured.
    if name == "RedisBudgetStore":
        from gateway.budget.redis import RedisBudgetStore  # noqa: PLC0415

        return RedisBudgetStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_store(
    redis_url: str | None,
    *,
    namespace: str = "egress",
    ca_bundle: str | None = None,
    min_replicas: int = 0,
) -> BudgetStore:
    """The store for these settings: Redis when a URL is given, else this process's memory.

    The URL may name one server, a Sentinel group or a Cluster, over TLS or not
    (`redis_connect.py`). Opening does not connect (redis-py connects lazily), so a gateway starts
    while Redis is down and reports it through `ping()` (`/readyz`) and `store_unavailable` on
    budgeted calls. A malformed URL is `invalid_input` at start.
    """
    if redis_url:
        from gateway.budget.redis import RedisBudgetStore  # noqa: PLC0415
        from gateway.budget.redis_connect import RedisUrlError  # noqa: PLC0415

        try:
            return RedisBudgetStore(redis_url, namespace=namespace, ca_bundle=ca_bundle, min_replicas=min_replicas)
        except RedisUrlError as exc:
            raise GatewayError(ErrorCode.INVALID_INPUT, str(exc)) from None
    return MemoryBudgetStore()
