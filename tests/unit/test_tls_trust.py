"""TlsTrust: a bad extra bundle stops the start; the store itself is built once, on first use."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path

import pytest

from gateway.egress.connect import TlsTrust
from gateway.errors import ErrorCode, GatewayError
from tests.harness.certs import TestPKI


def _subjects(context: ssl.SSLContext) -> list[str]:
    return [str(cert["subject"]) for cert in context.get_ca_certs()]


def test_an_extra_bundle_that_does_not_load_is_refused_when_the_trust_is_made(tmp_path: Path) -> None:
    bundle = tmp_path / "extra.pem"
    bundle.write_text("not a certificate\n")
    with pytest.raises(GatewayError) as caught:
        TlsTrust(str(bundle))
    assert caught.value.code == ErrorCode.INVALID_INPUT
    assert "EGRESS_CA_BUNDLE" in caught.value.message


async def test_the_store_is_built_once_and_trusts_certifi_and_the_extra_bundle(pki: TestPKI, tmp_path: Path) -> None:
    bundle = tmp_path / "extra.pem"
    shutil.copy(pki.ca_path, bundle)
    trust = TlsTrust(str(bundle))
    first = await trust.context()
    assert await trust.context() is first
    assert first.verify_mode == ssl.CERT_REQUIRED
    assert first.check_hostname
    assert first.minimum_version == ssl.TLSVersion.TLSv1_2
    # certifi's roots and the test CA: many more than the one extra certificate.
    assert len(first.get_ca_certs()) > 100
    expected = ssl.create_default_context(cafile=str(pki.ca_path))
    assert set(_subjects(expected)) <= set(_subjects(first))


async def test_a_bundle_spoiled_after_start_fails_the_call_and_a_repaired_one_is_used_next(
    pki: TestPKI, tmp_path: Path
) -> None:
    bundle = tmp_path / "extra.pem"
    shutil.copy(pki.ca_path, bundle)
    trust = TlsTrust(str(bundle))
    bundle.write_text("truncated by a bad mount\n")
    with pytest.raises(GatewayError) as caught:
        await trust.context()
    assert caught.value.code == ErrorCode.CONNECT_FAILURE
    assert caught.value.message.startswith("no TLS trust store: EGRESS_CA_BUNDLE")
    shutil.copy(pki.ca_path, bundle)
    assert len((await trust.context()).get_ca_certs()) > 100
