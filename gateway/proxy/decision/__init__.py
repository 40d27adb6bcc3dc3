"""The proxy's decision step: the caches in front of it, its audit records, and live permission.

`caches` remembers what a decision is computed from (principal per credential, vetted hosts,
parsed targets); `records` writes each decision's audit line and count, and a forwarded request's
close line; `live_permission` re-judges an open connection after a reload. The decisions
themselves are the egress core's. Never dials, never writes to a client.
"""
