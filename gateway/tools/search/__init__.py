"""web_search: engine request builders, page parsers, normalisation and the aggregator.

This package owns how each search engine is asked and read, how rows become safe
`{title, url, snippet}` results, and the tiered walk over engines with retries and a cache. It never
opens a socket: every request leaves through the `Transport` seam in `transport.py`, which the
egress core implements with its guarded client.
"""

from __future__ import annotations
