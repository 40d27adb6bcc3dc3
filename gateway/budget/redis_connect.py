"""Redis deployment forms: one URL names a single server, a Sentinel group or a Cluster.

Owns turning `EGRESS_REDIS_URL` (and the Redis CA bundle) into one redis-py asyncio client with
the gateway's timeouts, pool bound and retry rule. It parses and builds only: it never sends a
command (redis-py connects lazily), never reads the environment, and never logs a password.

| scheme | deployment |
|---|---|
| `redis://` / `rediss://` | one server (`rediss` is TLS) |
| `redis+sentinel://` / `rediss+sentinel://` | `host:port,...` of the sentinels, path `/<service>[/<db>]` |
| `redis+cluster://` / `rediss+cluster://` | `host:port,...` of any cluster nodes (startup nodes) |
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

CONNECT_TIMEOUT_S = 1.0
# A budget check sits in front of every tool call: a slow Redis must fail the call, not hang it.
OPERATION_TIMEOUT_S = 2.0
POOL_WAIT_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 64
DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379

Topology = Literal["single", "sentinel", "cluster"]

_SCHEMES: Mapping[str, tuple[Topology, bool]] = MappingProxyType(
    {
        "redis": ("single", False),
        "rediss": ("single", True),
        "redis+sentinel": ("sentinel", False),
        "rediss+sentinel": ("sentinel", True),
        "redis+cluster": ("cluster", False),
        "rediss+cluster": ("cluster", True),
    }
)


class RedisUrlError(ValueError):
    """`EGRESS_REDIS_URL` cannot be used; the message never repeats the password."""


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """A parsed `EGRESS_REDIS_URL`: which deployment, where, and how to authenticate."""

    topology: Topology
    tls: bool
    nodes: tuple[tuple[str, int], ...]
    service: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    url: str = ""

    def __repr__(self) -> str:
        hosts = ",".join(f"{host}:{port}" for host, port in self.nodes)
        return f"RedisTarget({self.topology}, tls={self.tls}, nodes={hosts}, service={self.service!r})"


def _nodes(netloc: str, default_port: int) -> tuple[tuple[str, int], ...]:
    nodes: list[tuple[str, int]] = []
    for item in netloc.split(","):
        text = item.strip()
        if not text:
            raise RedisUrlError("EGRESS_REDIS_URL: empty host in the node list")
        if text.startswith("["):
            host, _, rest = text[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port_text = text.partition(":")
        try:
            port = int(port_text) if port_text else default_port
        except ValueError:
            raise RedisUrlError(f"EGRESS_REDIS_URL: {text!r} has no numeric port") from None
        if not host or not 0 < port < 65536:
            raise RedisUrlError(f"EGRESS_REDIS_URL: {text!r} is not host:port")
        nodes.append((host, port))
    return tuple(nodes)


def parse_redis_url(url: str) -> RedisTarget:
    """Validate a URL of one of the forms in the module docstring."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise RedisUrlError(f"EGRESS_REDIS_URL: scheme must be one of {', '.join(_SCHEMES)}")
    topology, tls = _SCHEMES[scheme.lower()]
    netloc, _, path = rest.partition("/")
    path = path.split("?", 1)[0].split("#", 1)[0]
    username = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user_text, has_password, password_text = userinfo.partition(":")
        username = urllib.parse.unquote(user_text) or None
        password = urllib.parse.unquote(password_text) if has_password else None
    if topology == "single":
        if "," in netloc:
            raise RedisUrlError("EGRESS_REDIS_URL: one host for redis://; use redis+sentinel:// or redis+cluster://")
        # redis-py parses the single-server form itself (db, query options); keep its rules.
        return RedisTarget("single", tls, _nodes(netloc, DEFAULT_PORT), url=url)
    parts = [part for part in path.split("/") if part]
    service: str | None = None
    db = 0
    if topology == "sentinel":
        if not parts:
            raise RedisUrlError("EGRESS_REDIS_URL: redis+sentinel:// needs the service name as its path")
        service = urllib.parse.unquote(parts[0])
        parts = parts[1:]
    if parts:
        if topology == "cluster" or len(parts) > 1 or not parts[0].isdigit():
            raise RedisUrlError(f"EGRESS_REDIS_URL: unexpected path {path!r}")
        db = int(parts[0])
    default_port = DEFAULT_SENTINEL_PORT if topology == "sentinel" else DEFAULT_PORT
    return RedisTarget(topology, tls, _nodes(netloc, default_port), service, db, username, password, url)


def _retry() -> Retry:
    # One immediate retry on a broken connection lets a pooled connection that died with a Redis
    # restart reconnect transparently. Timeouts are not retried: a script that ran but whose reply
    # was slow would be counted twice, and a caller has waited long enough.
    return Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


def _tls_options(target: RedisTarget, ca_bundle: str | None) -> dict[str, Any]:
    if not target.tls:
        return {}
    options: dict[str, Any] = {"ssl": True, "ssl_cert_reqs": "required", "ssl_check_hostname": True}
    if ca_bundle:
        options["ssl_ca_certs"] = ca_bundle
    return options


def connect_redis(url: str, *, ca_bundle: str | None = None) -> Redis | RedisCluster:
    """One client for the deployment `url` names; nothing is sent until its first command."""
    target = parse_redis_url(url)
    tls = _tls_options(target, ca_bundle)
    timeouts: dict[str, Any] = {
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": OPERATION_TIMEOUT_S,
    }
    if target.topology == "single":
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=MAX_CONNECTIONS,
            timeout=POOL_WAIT_TIMEOUT_S,
            retry=_retry(),
            **timeouts,
            **{key: value for key, value in tls.items() if key != "ssl"},
        )
        return Redis.from_pool(pool)
    options: dict[str, Any] = {
        "username": target.username,
        "password": target.password,
        "max_connections": MAX_CONNECTIONS,
        "retry": _retry(),
    }
    if target.topology == "cluster":
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
            **options,
            **timeouts,
            **tls,
        )
    assert target.service is not None
    # Sentinels are asked over the same transport (TLS or not) with the same timeouts; the
    # credentials in the URL are those of the data nodes.
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(target.nodes), sentinel_kwargs={**timeouts, **tls}, **timeouts, **tls
    )
    client: Redis = sentinel.master_for(target.service, db=target.db, **options)
    return client


async def close_redis(client: Redis | RedisCluster) -> None:
    """Close the client and, for Sentinel, the clients it holds to each sentinel (redis-py's
    `aclose` leaves those sockets open)."""
    await client.aclose()
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        await sentinel.aclose()
