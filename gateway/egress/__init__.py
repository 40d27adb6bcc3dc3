"""The egress core: the one path by which the gateway reaches the internet."""
