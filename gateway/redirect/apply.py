"""Running the rendered rules: `nft -f -` (one atomic transaction) or iptables-restore.

Owns the commands and their failures: a command that is missing or that the kernel refuses
becomes a GatewayError with the tool's own one-line reason, never a traceback. Never renders a
rule itself (rules.py does).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from gateway.errors import ErrorCode, GatewayError
from gateway.redirect.rules import IPT_CHAIN, RedirectPlan, render_iptables, render_nft, render_nft_remove

COMMAND_TIMEOUT_S = 20.0
IPTABLES_FAMILIES = (("iptables", "iptables-restore", 4), ("ip6tables", "ip6tables-restore", 6))


def _run(argv: Sequence[str], stdin: str | None = None, *, check: bool = True) -> bool:
    return _output(argv, stdin, check=check) is not None


def _output(argv: Sequence[str], stdin: str | None = None, *, check: bool = True) -> str | None:
    """The command's stdout, or None when it failed and `check` is off."""
    if shutil.which(argv[0]) is None:
        raise GatewayError(ErrorCode.UNAVAILABLE, f"{argv[0]} is not installed")
    try:
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell
            list(argv), input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GatewayError(ErrorCode.UNAVAILABLE, f"{argv[0]} failed: {exc}") from None
    if done.returncode != 0 and check:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise GatewayError(
            ErrorCode.UNAVAILABLE, f"{' '.join(argv)} exited {done.returncode}: {reason[0] if reason else ''}"
        )
    return done.stdout if done.returncode == 0 else None


@dataclass(frozen=True, slots=True)
class Command:
    """One command `--apply` runs: argv, what it reads on stdin, and the check that makes it a
    no-op when its effect is already there (run `unless` first; skip `argv` if it succeeds)."""

    argv: tuple[str, ...]
    stdin: str | None = None
    unless: tuple[str, ...] | None = None


def install_commands(plan: RedirectPlan, backend: str) -> list[Command]:
    """Every command `--apply` runs, in order: `--print` renders this very list, so the two
    cannot drift apart whatever the rules say."""
    if backend == "nftables":
        return [Command(("nft", "-f", "-"), render_nft(plan))]
    commands: list[Command] = []
    for binary, restore, version in IPTABLES_FAMILIES:
        # Our chain replaced in one restore per family, then one jump from OUTPUT if not there yet.
        commands.append(Command((restore, "--noflush"), render_iptables(plan, version)))
        for table in ("nat", "filter"):
            jump = ("-w", "-t", table)
            commands.append(
                Command(
                    (binary, *jump, "-I", "OUTPUT", "1", "-j", IPT_CHAIN),
                    unless=(binary, *jump, "-C", "OUTPUT", "-j", IPT_CHAIN),
                )
            )
    return commands


def run_commands(commands: Sequence[Command]) -> None:
    for command in commands:
        if command.unless is not None and _run(command.unless, check=False):
            continue
        _run(command.argv, command.stdin)


_HEREDOC = "EGRESS_GATEWAY_RULES"


def as_shell(commands: Sequence[Command]) -> str:
    """The commands as a POSIX shell script that does what `run_commands` does."""
    lines = ["#!/bin/sh", "# egress-gateway redirect --apply runs exactly these commands, in this order.", "set -e"]
    for command in commands:
        text = shlex.join(command.argv)
        if command.unless is not None:
            text = f"{shlex.join(command.unless)} 2>/dev/null || {text}"
        if command.stdin is not None:
            body = command.stdin if command.stdin.endswith("\n") else command.stdin + "\n"
            # A delimiter no line of the body is, so the here-document ends where the body does.
            delimiter = _HEREDOC
            while delimiter in body.splitlines():
                delimiter += "_"
            text = f"{text} <<'{delimiter}'\n{body}{delimiter}"
        lines.append(text)
    return "\n".join(lines) + "\n"


def apply_nft(plan: RedirectPlan) -> None:
    run_commands(install_commands(plan, "nftables"))


def remove_nft() -> None:
    _run(["nft", "-f", "-"], render_nft_remove())


def apply_iptables(plan: RedirectPlan) -> None:
    run_commands(install_commands(plan, "iptables"))


def remove_iptables() -> None:
    for binary, _, _ in IPTABLES_FAMILIES:
        for table in ("nat", "filter"):
            while _run([binary, "-w", "-t", table, "-D", "OUTPUT", "-j", IPT_CHAIN], check=False):
                pass
            if _run([binary, "-w", "-t", table, "-F", IPT_CHAIN], check=False):
                _run([binary, "-w", "-t", table, "-X", IPT_CHAIN])
    _remove_emptied_nft_tables()


def _remove_emptied_nft_tables() -> None:
    """iptables-nft leaves `nat` and `filter` tables behind, empty: delete those that now do nothing.

    A table goes only when it holds no rule, no set or map, and no chain with a policy but accept,
    so another tool's rules (or its default-drop chain) are never touched. iptables-legacy's
    tables are the kernel's own and cannot be removed; there is nothing to do for them.
    """
    version = _output(["iptables", "--version"], check=False) or ""
    if "nf_tables" not in version or shutil.which("nft") is None:
        return
    for family in ("ip", "ip6"):
        for table in ("nat", "filter"):
            listing = _output(["nft", "-j", "list", "table", family, table], check=False)
            if listing is not None and _does_nothing(listing):
                _run(["nft", "delete", "table", family, table], check=False)


def _does_nothing(listing: str) -> bool:
    try:
        objects = orjson.loads(listing).get("nftables", [])
    except (orjson.JSONDecodeError, AttributeError):
        return False
    for item in objects:
        kind = next(iter(item), "")
        if kind in ("metainfo", "table"):
            continue
        if kind != "chain" or item["chain"].get("policy", "accept") != "accept":
            return False
    return True
