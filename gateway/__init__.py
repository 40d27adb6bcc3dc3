"""egress-gateway: the one path by which containerized agents reach the internet."""

__version__ = "0.1.0"
