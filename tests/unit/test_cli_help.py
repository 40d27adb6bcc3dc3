"""Every option of every command says what it does (issue 29: `--format`, `--print`, ... had no
help), the listener flags are offered only where something listens, and a misspelled setting
is matched to the setting it most likely meant."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from gateway.cli import build_parser
from gateway.settings import closest_setting

LISTENER_FLAGS = {"--proxy-listen", "--api-listen", "--admin-listen"}


def _commands(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path or "egress-gateway", parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{path} {name}".strip())


def test_every_option_and_argument_of_every_command_has_help() -> None:
    missing = [
        f"{command}: {action.option_strings or action.dest}"
        for command, parser in _commands(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert missing == []


def test_listener_flags_are_offered_only_by_serve() -> None:
    offering = {
        command
        for command, parser in _commands(build_parser())
        if LISTENER_FLAGS & {flag for action in parser._actions for flag in action.option_strings}
    }
    assert offering == {"serve"}


KNOWN = [
    "EGRESS_AUDIT_LOG",
    "EGRESS_AUDIT_ON_FAILURE",
    "EGRESS_AUDIT_KEEP_FILES",
    "EGRESS_AUDIT_MAX_BYTES",
    "EGRESS_AUDIT_AGGREGATE_S",
    "EGRESS_POLICY",
    "EGRESS_PROXY_LISTEN",
    "EGRESS_API_LISTEN",
    "EGRESS_NAMESERVERS",
]


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        pytest.param("EGRESS_AUDIT_FILE", "EGRESS_AUDIT_LOG", id="synonym-of-the-same-shape"),
        pytest.param("EGRESS_AUDIT_LGO", "EGRESS_AUDIT_LOG", id="transposed-letters"),
        pytest.param("EGRESS_POLCY", "EGRESS_POLICY", id="one-word-typo"),
        pytest.param("EGRESS_PROXY_LISTN", "EGRESS_PROXY_LISTEN", id="shared-first-word"),
        pytest.param("EGRESS_NAMESERVER", "EGRESS_NAMESERVERS", id="singular"),
        pytest.param("EGRESS_ON_FAILURE", "EGRESS_AUDIT_ON_FAILURE", id="missing-word"),
        pytest.param("EGRESS_COLOUR", None, id="nothing-close"),
    ],
)
def test_a_misspelled_setting_is_matched_word_by_word(typed: str, meant: str | None) -> None:
    assert closest_setting(typed, KNOWN) == meant
