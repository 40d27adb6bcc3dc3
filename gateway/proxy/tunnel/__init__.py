"""Tunnels, CONNECT and transparent alike: the attempt that opens one, and the splice once open.

`attempt` takes a client from its ask to a splice or an inspected hand-over (decision, DNS,
limits, pinned dial), the listeners differing only through a `TunnelSurface` (`connect_surface`
is the forward proxy's); `opener` keeps the limits, the dials in flight and the open tunnels;
`splice` carries bytes both ways with the SNI gate, backpressure and deadlines. Never parses
HTTP (the listener does), never alters the payload.
"""
