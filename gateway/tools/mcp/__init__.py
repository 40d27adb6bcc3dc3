"""MCP for the tools: the JSON-RPC surface (protocol.py), its HTTP and stdio transports, the bridge.

The `mcp` SDK's server machinery assumes Starlette/ASGI; the gateway serves aiohttp, so the small
surface (initialize, ping, tools/list, tools/call, server/discover) is implemented here and its
conformance proved with the SDK's own clients in tests. The SDK is never imported at run time
(its import alone costs about a second of start-up): tests only.
"""
