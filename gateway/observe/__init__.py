"""Observability: every metric in metrics.py, the JSON audit log in audit.py."""
