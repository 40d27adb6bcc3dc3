"""What a real `serve` loads before it is ready: optional and heavy modules wait for first use.

The daemon runs through the real CLI with PYTHONPROFILEIMPORTTIME=1, the interpreter's own import
log (one stderr line per module imported), and the log is read once /readyz has answered 200.
A module on the list below at that point costs every sidecar start time and memory for a
feature it may never use.
"""

from __future__ import annotations

import pytest

from tests.conftest import GatewayFactory
from tests.harness.gateway import GatewayProcess, free_port, policy_document

IMPORT_LOG = {"PYTHONPROFILEIMPORTTIME": "1"}

NEVER_AT_START = (
    "jsonschema",  # the audit schema is checked by the tests, never by the daemon
    "mcp",  # the MCP SDK: /mcp is served by gateway.tools.mcp without it
    "redis",  # only with EGRESS_REDIS_URL
    "gateway.budget.redis",
    "charset_normalizer",  # the converters load with the first page
    "pypdfium2",
    "selectolax",  # lexbor: the first HTML page or HTML result page
    "gateway.tools.extract.decode",
    "gateway.tools.extract.main_content",
    "gateway.tools.extract.markdown",
    "gateway.tools.extract.pdf",
    "psutil",  # the interface table, only for a wildcard listener
    "dnslib",  # only with EGRESS_DNS_LISTEN
    "gateway.dnsguard.server",
    "gateway.transparent.listener",  # only with EGRESS_TRANSPARENT_LISTEN
    "gateway.redirect",  # the `redirect` command
    "gateway.tools.mcp.stdio",  # the `mcp` command
    "tomllib",  # only with --config FILE.toml
    "difflib",  # only to name the closest setting in an error
)


def imported_before_ready(gateway: GatewayProcess) -> set[str]:
    """Module names from the import log written up to now (the gateway has answered /readyz)."""
    names = set()
    for line in gateway.stderr().splitlines():
        if line.startswith("import time:") and "|" in line and "imported package" not in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def test_serve_with_default_settings_imports_no_optional_module(gateway_factory: GatewayFactory) -> None:
    gateway = gateway_factory(policy_document(), env=IMPORT_LOG)
    imported = imported_before_ready(gateway)
    # The log is real: it shows the daemon's own wiring and the web framework it serves with.
    assert {"gateway.app", "gateway.proxy.server", "aiohttp.web"} <= imported
    loaded = sorted(name for name in imported if any(name == m or name.startswith(m + ".") for m in NEVER_AT_START))
    assert loaded == []


@pytest.mark.parametrize(
    ("setting", "module"),
    [
        pytest.param("EGRESS_DNS_LISTEN", "dnslib", id="dns-listener-loads-dnslib"),
        pytest.param("EGRESS_TRANSPARENT_LISTEN", "gateway.transparent.listener", id="transparent-listener"),
    ],
)
def test_an_interception_listener_loads_its_modules_when_set(
    gateway_factory: GatewayFactory, setting: str, module: str
) -> None:
    gateway = gateway_factory(policy_document(), env={**IMPORT_LOG, setting: f"127.0.0.1:{free_port()}"})
    assert module in imported_before_ready(gateway)
