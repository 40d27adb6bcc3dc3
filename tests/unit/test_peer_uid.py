"""The uid behind a loopback peer (real sockets, the kernel's own tables) and its binding to a
principal (`authenticate_bound`, pure)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.peer_uid import loopback_peer_uid
from gateway.policy.decide import authenticate_bound, token_digest
from gateway.policy.load import parse_policy


@pytest.fixture(params=[("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)], ids=["v4", "v6"])
def accepted(request: pytest.FixtureRequest) -> Iterator[socket.socket]:
    host, family = request.param
    with socket.socket(family, socket.SOCK_STREAM) as server:
        server.bind((host, 0))
        server.listen(1)
        with socket.create_connection(server.getsockname()[:2]) as _client:
            connection, _ = server.accept()
            with connection:
                yield connection


def test_the_uid_of_a_loopback_peer_is_read_from_the_kernel(accepted: socket.socket) -> None:
    assert loopback_peer_uid(accepted.getpeername(), accepted.getsockname()) == os.getuid()


def test_a_peer_that_is_gone_or_not_on_loopback_has_no_uid(accepted: socket.socket) -> None:
    local = accepted.getsockname()
    assert loopback_peer_uid(("127.0.0.1", 1, *local[2:]), local) is None
    assert loopback_peer_uid(("203.0.113.5", 40000), ("203.0.113.1", 3128)) is None
    assert loopback_peer_uid(None, local) is None


POLICY = parse_policy(
    f"""version: 1
principals:
  default: {{egress: {{allow_domains: ['*']}}}}
  research: {{token_sha256: '{token_digest("research-token")}', egress: {{allow_domains: [example.org]}}}}
  coder: {{token_sha256: '{token_digest("coder-token")}', egress: {{allow_domains: [example.net]}}}}
transparent:
  principals: {{1000: research}}
"""
)


@pytest.mark.parametrize(
    ("uid", "token", "expected"),
    [
        pytest.param(1000, None, "research", id="bound-uid-without-credential-is-its-principal"),
        pytest.param(1000, "research-token", "research", id="bound-uid-with-its-own-token"),
        pytest.param(1002, None, "default", id="unlisted-uid-is-default"),
        pytest.param(1002, "coder-token", "coder", id="unlisted-uid-with-a-token"),
        pytest.param(None, "coder-token", "coder", id="unknown-uid-authenticates-as-before"),
    ],
)
def test_a_bound_uid_is_its_principal(uid: int | None, token: str | None, expected: str) -> None:
    assert authenticate_bound(POLICY, None, token, uid).name == expected


def test_a_bound_uid_cannot_borrow_another_principals_token() -> None:
    with pytest.raises(GatewayError) as caught:
        authenticate_bound(POLICY, None, "coder-token", 1000)
    assert caught.value.code is ErrorCode.POLICY_DENIED
    assert "bound to principal 'research'" in caught.value.message
    with pytest.raises(GatewayError) as wrong:
        authenticate_bound(POLICY, None, "guessed", 1000)
    assert wrong.value.code is ErrorCode.AUTH_REQUIRED
