"""The address a redirected connection was dialed at, read back from the kernel's NAT table.

`SO_ORIGINAL_DST` (IPv4) and `IP6T_SO_ORIGINAL_DST` (IPv6) are the netfilter socket options the
nat REDIRECT leaves behind. The family asked must be the socket's own: asking an IPv6 socket for
the IPv4 option fails (mitmproxy notes runtimes that crashed on the wrong one), and an IPv4
client on a dual-stack IPv6 socket shows up as an IPv4-mapped address.

Never decides anything about the address; only reads it.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from gateway.vet.addresses import IPAddress

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
IP6T_SO_ORIGINAL_DST = 80  # linux/netfilter_ipv6/ip6_tables.h
SOL_IPV6 = 41
SOCKADDR_IN6_BYTES = 28
SOCKADDR_IN_BYTES = 16


def original_destination(sock: socket.socket) -> tuple[IPAddress, int] | None:
    """(address, port) the client dialed, or None when the connection was not redirected."""
    try:
        if sock.family == socket.AF_INET6:
            raw = sock.getsockopt(SOL_IPV6, IP6T_SO_ORIGINAL_DST, SOCKADDR_IN6_BYTES)
            port = struct.unpack_from("!H", raw, 2)[0]
            address6 = ipaddress.IPv6Address(raw[8:24])
            address: IPAddress = address6.ipv4_mapped or address6
        else:
            raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, SOCKADDR_IN_BYTES)
            port = struct.unpack_from("!H", raw, 2)[0]
            address = ipaddress.IPv4Address(raw[4:8])
    except OSError:
        # ENOENT: no conntrack NAT entry, the client connected to the listener directly.
        return None
    local = sock.getsockname()
    if ipaddress.ip_address(local[0].split("%")[0]) == address and local[1] == port:
        return None
    return address, port
