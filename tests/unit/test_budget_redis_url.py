"""`EGRESS_REDIS_URL` forms: one server, Sentinel, Cluster, with or without TLS and credentials."""

from __future__ import annotations

import pytest

from gateway.app import redact_url
from gateway.budget.redis_connect import RedisTarget, RedisUrlError, parse_redis_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6380/2", RedisTarget("single", False, (("127.0.0.1", 6380),))),
        ("rediss://cache.internal", RedisTarget("single", True, (("cache.internal", 6379),))),
        (
            "redis+sentinel://:s3cret@10.0.0.1,10.0.0.2:26380,[::1]:26381/mymaster/3",
            RedisTarget(
                "sentinel",
                False,
                (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("::1", 26381)),
                "mymaster",
                3,
                None,
                "s3cret",
            ),
        ),
        (
            "rediss+cluster://app:pw%40x@n1:7000,n2:7001",
            RedisTarget("cluster", True, (("n1", 7000), ("n2", 7001)), None, 0, "app", "pw@x"),
        ),
    ],
    ids=["single", "tls-default-port", "sentinel-db-ipv6", "cluster-tls-userinfo"],
)
def test_each_deployment_form_parses(url: str, expected: RedisTarget) -> None:
    target = parse_redis_url(url)
    assert (target.topology, target.tls, target.nodes, target.service) == (
        expected.topology,
        expected.tls,
        expected.nodes,
        expected.service,
    )
    if expected.topology != "single":
        assert (target.db, target.username, target.password) == (expected.db, expected.username, expected.password)


@pytest.mark.parametrize(
    "url",
    [
        "http://h:1",
        "redis:/h",
        "redis://a:1,b:2",
        "redis+sentinel://a:26379",
        "redis+sentinel://a:26379/svc/x",
        "redis+cluster://a:1/0",
        "redis+cluster://a:port",
        "redis+cluster://a:1,,b:2",
        "redis+cluster://:pw@:1",
    ],
    ids=[
        "scheme",
        "no-authority",
        "two-hosts-single",
        "sentinel-no-service",
        "sentinel-bad-db",
        "cluster-db",
        "bad-port",
        "empty-host",
        "no-host",
    ],
)
def test_a_malformed_url_is_refused_without_repeating_a_password(url: str) -> None:
    with pytest.raises(RedisUrlError) as caught:
        parse_redis_url(url)
    assert "EGRESS_REDIS_URL" in str(caught.value)
    assert "pw" not in str(caught.value)


def test_the_password_never_shows_in_a_repr_or_the_start_up_line() -> None:
    url = "redis+sentinel://user:hunter2@a:1,b:2/svc"
    assert "hunter2" not in repr(parse_redis_url(url))
    assert redact_url(url) == "redis+sentinel://***@a:1,b:2/svc"
