"""How the proxy waits for time: one deadline wheel per listener, and what each deadline means.

`wheel` is the one coarse loop timer and its entries; `limits` decides, from times alone, the
head deadline, keep-alive idle time, tunnel idle time and lifetime, half-closes and response
deadlines (pure). Never reads a socket.
"""
