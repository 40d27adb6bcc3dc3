"""The proxy's HTTP/1.1 core, sans I/O: bytes in, heads, events and bytes out.

Request heads and framing (`request_head`, `request_framing`, `chunked_end`), response heads and
re-framing (`response_head`, `response_fields`, `response_framing`), and the shared grammar and
error responses (`heads`). Never imports asyncio or touches a socket (the import-layer test holds
it to that), never decides policy.
"""
