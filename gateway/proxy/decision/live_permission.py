"""Live permission: whether an open tunnel or connection is still allowed by the policy now in force.

A tunnel is decided once, when it opens; a reload that denies its destination must not leave it
working until `proxy.max_tunnel_lifetime_s`. `revocation` re-runs the decision for what a
connection already holds (its principal, its vetted host and port, the address it dialed) under
the new policy, with the egress core's checks (`decide_destination`, `decide_addresses` through
the generation's address guard), and says why it is no longer allowed, or None.

Pure over its arguments: never resolves a name (the dialed address is what is judged), never
closes anything itself (the listener does, with close reason `policy_revoked`).
"""

from __future__ import annotations

import ipaddress

from gateway.egress.target import EgressCore, PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.decide import decide_addresses, decide_destination
from gateway.policy.model import LoadedPolicy, Principal

REVOKED_REASON = "policy_revoked"


def revocation(
    core: EgressCore, loaded: LoadedPolicy, principal: Principal, target: PinnedTarget, address: str
) -> GatewayError | None:
    """Why `principal` may no longer hold a connection to `target` at `address`, or None."""
    if target.generation == loaded.generation:
        return None
    policy = loaded.policy
    current = policy.principals.get(principal.name)
    if current is None or current.token_sha256 != principal.token_sha256:
        # The credential the connection was opened with no longer names this principal.
        return GatewayError(ErrorCode.AUTH_REQUIRED, f"principal {principal.name} changed in the policy")
    if policy.mode_for(current) == "report":
        return None
    decision = decide_destination(policy, current, target.host, target.port)
    if not decision.allowed:
        return decision.to_error()
    try:
        dialed = ipaddress.ip_address(address)
    except ValueError:
        return None  # not an address (cannot happen for a pinned dial): nothing new to judge
    vetted = decide_addresses(core.guard_for(loaded), current, target.name, (dialed,))
    if not vetted.allowed:
        return vetted.to_error()
    return None
