"""A keep-alive connection's kept decision: its last request's principal, target and what follows.

Owns `KeptDecision`, which the dispatcher fills and reuses while a connection repeats its
request (same credential, same absolute URI, same generation, `EgressCore.still_pinned`), and
which the client connection holds between requests.

Never decides (the egress core does), never reads a socket.
"""

from __future__ import annotations

from gateway.egress.target import PinnedTarget
from gateway.policy.model import Principal
from gateway.proxy.decision.caches import ForwardTarget
from gateway.proxy.decision.records import RequestLines
from gateway.proxy.forward.pool import PoolKey


class KeptDecision:
    """A client connection's last decision from cached state, for its next request: the same
    credential and absolute URI under the same generation get the same principal and target
    (`EgressCore.still_pinned` checks that the target still holds, as `pin_cached` would). It
    also keeps what follows from them: the pool keys, the last upstream head and audit lines."""

    __slots__ = (
        "authorization",
        "forward",
        "head",
        "head_chunked",
        "head_fields",
        "head_method",
        "lines",
        "lines_method",
        "pool_keys",
        "principal",
        "target",
        "url",
    )

    def __init__(
        self,
        authorization: bytes | None,
        url: bytes,
        principal: Principal,
        forward: ForwardTarget,
        target: PinnedTarget,
        *,
        pool_keys: tuple[PoolKey, ...],
    ) -> None:
        self.authorization = authorization
        self.url = url
        self.principal = principal
        self.forward = forward
        self.target = target
        self.pool_keys = pool_keys  # `UpstreamPool.keys_for(principal.name, target)`
        # The upstream head last built for this URI, and the request's method, forwarded field
        # lines and chunking it was built from: a request repeating them gets the same bytes
        # (`build_request_head` is a pure function).
        self.head = b""
        self.head_method = b""
        self.head_fields: bytes | None = None
        self.head_chunked = False
        # The audit lines of its last request and that request's method: a request with the
        # same method (and target) has the same lines (same principal, kind and path: same URI).
        self.lines: RequestLines | None = None
        self.lines_method = b""
