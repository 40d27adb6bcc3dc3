"""CONNECT tunnels (and the transparent listener's): opening one, and the splice once it is open.

`opener` takes a CONNECT from its head to a dialed upstream (limits, decision, pinned dial, the
200), `splice` carries bytes both ways with the SNI gate, backpressure and deadlines. Never
parses HTTP (the listener does), never alters the payload.
"""
