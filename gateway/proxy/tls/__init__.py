"""Reading a TLS handshake without terminating it: the ClientHello peek and the SNI gate.

`sni` parses a ClientHello's server name, `hello_gate` holds a tunnel's client bytes until every
ClientHello the server acts on has passed the SNI rule. Pure: never imports asyncio, never
decrypts, never reads a socket.
"""
