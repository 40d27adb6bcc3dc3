"""Credential brokering: held secrets, their placeholders, and the screening of outbound requests."""
