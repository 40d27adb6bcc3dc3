"""Plain HTTP forwarding: one absolute-URI request decided, sent upstream and its response relayed.

`exchange` holds one request and what both sides share about it, `dispatch` decides it and picks
an upstream, `pool` keeps idle upstream connections per principal and vetted address, `upstream`
relays one response through the HTTP/1.1 core. Never parses bytes itself (`http1` does).
"""
