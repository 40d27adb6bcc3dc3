"""The gateway's own addresses: never a destination, so nothing connects back to a listener.

A listener on one address owns that address. A listener on the wildcard (`0.0.0.0`, `::`)
answers on every address of the host, so all of them count: the whole loopback range
(127.0.0.0/8 and ::1, since Linux delivers every 127.x address locally) and each address of
each interface, read once at start. Reads the host's interface table; never opens a socket.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

from gateway.vet.addresses import IPAddress, IPNetwork

LOOPBACK_NETWORKS: tuple[IPNetwork, ...] = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


def host_addresses() -> tuple[IPAddress, ...]:
    """Every IPv4 and IPv6 address configured on an interface of this host (zone ids dropped)."""
    # Only a wildcard listener needs the interface table: psutil (~1.3 MB) is not loaded otherwise.
    import psutil  # noqa: PLC0415

    out: list[IPAddress] = []
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                out.append(ipaddress.ip_address(entry.address.split("%", 1)[0]))
            except ValueError:
                continue
    return tuple(out)


def own_addresses(listen_hosts: Iterable[str]) -> tuple[IPAddress | IPNetwork, ...]:
    """What the address guard must refuse as the gateway itself, for listeners on `listen_hosts`."""
    out: list[IPAddress | IPNetwork] = []
    wildcard = False
    for host in listen_hosts:
        ip = ipaddress.ip_address(host)
        if ip.is_unspecified:
            wildcard = True
        else:
            out.append(ip)
    if wildcard:
        out.extend(LOOPBACK_NETWORKS)
        out.extend(host_addresses())
    return tuple(dict.fromkeys(out))
