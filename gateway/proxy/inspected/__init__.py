"""TLS inspection inside the proxy (issue 25): an inspected connection's hand-over, TLS bridge,
request surface and records, and WebSocket relay. Composes the forward proxy's parts (its
`ClientConnection`, `ForwardDispatcher`, records and pool) through their small interfaces; it
subclasses none of the listener's classes.
"""
