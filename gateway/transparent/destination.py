"""The transparent listener's own rules on top of the CONNECT decision: destination and raw TCP.

`destination: follow-name` connects to the name's vetted addresses whatever the agent dialed
(CDNs answer differently per query); `strict` refuses an original address that is not among them
(`destination_mismatch`). Raw TCP is allowed only for the policy's `transparent.raw_tcp` entries,
decided on the original address, which must still pass the address guard. Pure: values in,
values or GatewayError out.
"""

from __future__ import annotations

import dataclasses

from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.model import RawTcpRule, TransparentSettings
from gateway.vet.addresses import IPAddress


def pin_destination(settings: TransparentSettings, target: PinnedTarget, original: IPAddress) -> PinnedTarget:
    """The target to dial: the name's vetted addresses (follow-name) or the original one (strict)."""
    if settings.destination == "follow-name":
        return target
    if original not in target.addresses:
        raise GatewayError(
            ErrorCode.DESTINATION_MISMATCH,
            f"the connection was dialed at {original}, which is not one of {target.name}'s vetted addresses "
            f"({', '.join(target.address_texts)}) (destination: strict)",
        )
    return dataclasses.replace(target, addresses=(original,))


def raw_rules_for_port(settings: TransparentSettings, port: int) -> tuple[RawTcpRule, ...]:
    return tuple(rule for rule in settings.raw_tcp if rule.port == port)
