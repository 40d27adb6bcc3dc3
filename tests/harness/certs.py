"""Test certificates: one trustme CA for the session, leaf certificates for real-looking names."""

from __future__ import annotations

import ssl
from pathlib import Path

import trustme


class TestPKI:
    __test__ = False

    def __init__(self, directory: Path) -> None:
        self.ca = trustme.CA()
        self.ca_path = directory / "test-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_path))

    def server_context(self, *names: str) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert(*names).configure_cert(context)
        return context

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context
