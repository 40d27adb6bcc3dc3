"""A gateway listening on the wildcard never dials itself through another local address (issue 12).

Listening on 0.0.0.0 means answering on 127.0.0.2 too (Linux delivers all of 127.0.0.0/8 locally),
so a name resolving there reaches the gateway's own listener unless every host address counts as
the gateway's own. The policy opens all of 127.0.0.0/8 so that only that rule can refuse.
"""

from __future__ import annotations

import pytest

from tests.conftest import GatewayFactory
from tests.harness.dns import FakeDNS
from tests.harness.gateway import free_port, policy_document
from tests.harness.proxy import open_tunnel

IO_TIMEOUT_S = 10.0


def connect_answer(port: int, authority: str) -> bytes:
    sock, answer = open_tunnel(port, authority, timeout_s=IO_TIMEOUT_S)
    sock.close()
    return answer


@pytest.mark.parametrize("address", ["127.0.0.2", "127.0.0.1"], ids=["other-loopback", "listener-address"])
def test_wildcard_listener_refuses_every_local_address_as_its_own(
    gateway_factory: GatewayFactory, fake_dns: FakeDNS, address: str
) -> None:
    name = f"self-{address.replace('.', '-')}.own.example"
    fake_dns.add(name, address)
    gateway = gateway_factory(
        policy_document(allow_cidrs=["127.0.0.0/8"], ports=[443]),
        env={"EGRESS_PROXY_LISTEN": f"0.0.0.0:{free_port('0.0.0.0')}"},
    )
    assert gateway.env["EGRESS_PROXY_LISTEN"].startswith("0.0.0.0:")
    # Port 443 of that address: the address is the gateway's own whatever the port (without the
    # rule the dial would be tried, and refused: a connect_failure, not this denial).
    answer = connect_answer(gateway.proxy_port, f"{name}:443")
    assert answer.startswith(b"HTTP/1.1 403 "), answer
    assert b"X-Egress-Code: blocked_destination" in answer
    lines = gateway.wait_audit(lambda lines: any(line.get("decision") == "deny" for line in lines))
    assert any("own listeners" in str(line.get("reason")) for line in lines if line.get("decision") == "deny")
