"""The agent-facing tools: web_fetch and web_search, built only on the egress core."""
