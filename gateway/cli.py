"""Command-line entry point: argument parsing only; each command dispatches to its module.

Exit codes: 0 success/allowed, 1 invalid policy file, 2 usage error, 3 denied (check).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import sys
from collections.abc import Sequence
from typing import Any

from gateway import __version__, commands
from gateway.commands import EXIT_OK, EXIT_USAGE
from gateway.errors import ErrorCode, GatewayError
from gateway.settings import (
    CONNECT_RUN_TOKEN_VARIABLE,
    CONNECT_TOKEN_VARIABLE,
    Settings,
    load_settings,
    read_settings_file,
)

# A bearer or run token is well under this; a larger file is not a token file.
MAX_TOKEN_FILE_BYTES = 4096


def _add_settings_flags(parser: argparse.ArgumentParser, *, listeners: bool = False) -> None:
    """The settings flags; the listen addresses only for `serve`, the one command that listens."""
    parser.add_argument("--config", help="YAML or TOML settings file; env and flags win over it (env EGRESS_CONFIG)")
    parser.add_argument("--policy", help="policy file (env EGRESS_POLICY)")
    if listeners:
        parser.add_argument("--proxy-listen", dest="proxy_listen", help="proxy IP:PORT (env EGRESS_PROXY_LISTEN)")
        parser.add_argument("--api-listen", dest="api_listen", help="tools API IP:PORT (env EGRESS_API_LISTEN)")
        parser.add_argument("--admin-listen", dest="admin_listen", help="admin IP:PORT (env EGRESS_ADMIN_LISTEN)")
    parser.add_argument(
        "--nameservers",
        help="comma list of IP[:PORT] of DNS servers, e.g. 10.0.0.10:53 (a name is refused: the resolver "
        "cannot look up its own servers) (env EGRESS_NAMESERVERS)",
    )
    parser.add_argument("--ca-bundle", dest="ca_bundle", help="extra trusted PEM (env EGRESS_CA_BUNDLE)")
    parser.add_argument("--redis-url", dest="redis_url", help="shared budgets (env EGRESS_REDIS_URL)")
    parser.add_argument("--audit-log", dest="audit_log", help="'-', a file, or 'off' (env EGRESS_AUDIT_LOG)")
    parser.add_argument("--log-level", dest="log_level", help="debug|info|warning|error (env EGRESS_LOG_LEVEL)")
    parser.add_argument(
        "--inspect-ca-cert", dest="inspect_ca_cert", help="interception CA (env EGRESS_INSPECT_CA_CERT)"
    )
    parser.add_argument("--inspect-ca-key", dest="inspect_ca_key", help="its key (env EGRESS_INSPECT_CA_KEY)")


def _add_ca_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ca = commands.add_parser("ca", help="the interception CA: init writes one, export what agents trust")
    ca_commands = ca.add_subparsers(dest="ca_command", required=True)
    ca_init = ca_commands.add_parser("init", help="write a new CA (certificate, and its key 0600)")
    _add_settings_flags(ca_init)
    ca_init.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    ca_export = ca_commands.add_parser("export", help="write the CA alone and the combined trust bundle")
    _add_settings_flags(ca_export)
    ca_export.add_argument("--ca-out", dest="ca_out", required=True, help="the CA certificate alone (PEM)")
    ca_export.add_argument("--bundle-out", dest="bundle_out", required=True, help="trust roots + the CA (PEM)")


def _add_redirect_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    redirect = commands.add_parser("redirect", help="render, apply or remove the pod's interception rules")
    action = redirect.add_mutually_exclusive_group(required=True)
    action_help = {
        "print": "print the commands --apply runs, with the rules they load, as a shell script",
        "apply": "install the rules (replacing ours, leaving other rules alone); needs NET_ADMIN",
        "remove": "remove our rules and chains; removing what is not there is not an error",
    }
    for name in ("print", "apply", "remove"):
        action.add_argument(f"--{name}", dest="action", action="store_const", const=name, help=action_help[name])
    redirect.add_argument(
        "--backend",
        choices=("nftables", "iptables"),
        default="nftables",
        help="nftables (default, one nft transaction) or iptables (iptables-restore, where nft is missing)",
    )
    redirect.add_argument("--policy", help="policy file, for transparent.principals (env EGRESS_POLICY)")
    redirect.add_argument("--transparent-listen", dest="transparent_listen", help="env EGRESS_TRANSPARENT_LISTEN")
    redirect.add_argument("--dns-listen", dest="dns_listen", help="env EGRESS_DNS_LISTEN")
    redirect.add_argument("--gateway-uid", dest="gateway_uid", help="exempt uid (env EGRESS_GATEWAY_UID)")
    redirect.add_argument("--exclude-cidrs", dest="exclude_cidrs", help="env EGRESS_REDIRECT_EXCLUDE_CIDRS")
    redirect.add_argument("--exclude-ports", dest="exclude_ports", help="env EGRESS_REDIRECT_EXCLUDE_PORTS")


def _add_mcp_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mcp = commands.add_parser("mcp", help="speak MCP on stdio (tools in-process, or --connect to a gateway)")
    _add_settings_flags(mcp)
    mcp.add_argument("--connect", help="bridge stdio to a running gateway's /mcp, e.g. http://gw:8080")
    # Credentials never ride on the command line, where every user of the host reads them in the
    # process list: the environment or a file. The old flags stay only to say so.
    mcp.add_argument(
        "--token-file",
        dest="token_file",
        help=f"with --connect: file holding the bearer token (else ${CONNECT_TOKEN_VARIABLE})",
    )
    mcp.add_argument(
        "--run-token-file",
        dest="run_token_file",
        help=f"with --connect: file holding the run token, X-Egress-Run-Token (else ${CONNECT_RUN_TOKEN_VARIABLE})",
    )
    mcp.add_argument("--token", dest="token_on_command_line", help=argparse.SUPPRESS)
    mcp.add_argument("--run-token", dest="run_token_on_command_line", help=argparse.SUPPRESS)
    mcp.add_argument("--principal", help="in-process: the policy principal to act as (default: the default one)")


def _add_check_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = commands.add_parser("check", help="resolve and decide a URL without connecting")
    _add_settings_flags(check)
    check.add_argument("--principal", help="principal name (default: the default principal)")
    check.add_argument("--method", help="also judge METHOD URL by the inspect rules and name the rule")
    check.add_argument("url", help="the URL to decide, as web_fetch would vet it")


def _add_credentials_parser(commands: Any) -> None:
    credentials = commands.add_parser("credentials", help="brokered credentials: placeholders and the key")
    credential_commands = credentials.add_subparsers(dest="credentials_command", required=True)
    placeholders = credential_commands.add_parser(
        "placeholders", help="print each credential's placeholder for the agent's environment"
    )
    _add_settings_flags(placeholders)
    placeholders.add_argument(
        "--format", choices=("env", "json"), default="env", help="VAR=placeholder lines (env) or a JSON object"
    )
    credential_commands.add_parser("key", help="print a new random placeholder key (store it as a Secret)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="egress-gateway", description="The egress gateway for AI agents.")
    parser.add_argument("--version", action="version", version=f"egress-gateway {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the daemon (proxy, tools API, admin)")
    _add_settings_flags(serve, listeners=True)

    _add_check_parser(commands)

    policy = commands.add_parser("policy", help="policy tools")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    lint = policy_commands.add_parser("lint", help="validate policy files; --diff OLD NEW shows what a change allows")
    lint.add_argument("files", nargs="*", help="policy files to validate")
    lint.add_argument(
        "--diff", nargs=2, metavar=("OLD", "NEW"), help="also print what NEW allows or denies that OLD did not"
    )
    suggest = policy_commands.add_parser(
        "suggest",
        help="learn mode: the smallest policy that would have allowed what an audit log saw",
        description="Read audit lines (report or enforce mode) and print the smallest policy that would have "
        "allowed the traffic they record, per principal, with denials and address-guard refusals listed apart.",
    )
    suggest.add_argument(
        "--from",
        dest="sources",
        action="append",
        required=True,
        metavar="AUDIT_LOG",
        help="an audit log file, or '-' for stdin; repeat for rotated files",
    )
    suggest.add_argument("--principal", help="only this principal's lines (default: every principal seen)")
    suggest.add_argument("--since", help="only lines from this time on: 2026-12-01T11:00:00Z, or an age: 30m, 2h, 7d")
    suggest.add_argument(
        "--base",
        metavar="POLICY",
        help="start from this policy (tokens, budgets, settings kept) and list what the suggestion opens or closes",
    )
    suggest.add_argument("--output", "-o", metavar="FILE", help="write the policy to FILE and print only the review")
    policy_commands.add_parser("token", help="print a new token and its token_sha256 line")
    policy_commands.add_parser("hash-token", help="read a token on stdin, print its token_sha256 line")

    _add_credentials_parser(commands)
    fetch = commands.add_parser("fetch", help="fetch one page as markdown")
    _add_settings_flags(fetch)
    fetch.add_argument("url", help="the page to fetch")
    fetch.add_argument(
        "--max-chars", dest="max_chars", type=int, default=16_000, help="characters printed at most (default 16000)"
    )
    fetch.add_argument(
        "--offset",
        type=int,
        default=0,
        help="where the printed window starts: the offset a truncated fetch says to read on with (default 0)",
    )

    search = commands.add_parser("search", help="run one web search")
    _add_settings_flags(search)
    search.add_argument("query", help="what to search for")
    search.add_argument(
        "--max-results", dest="max_results", type=int, default=10, help="results printed at most (default 10)"
    )

    _add_mcp_parser(commands)

    tools = commands.add_parser("tools", help="print the tool definitions for function calling")
    tools.add_argument(
        "--format",
        choices=("openai", "anthropic", "mcp"),
        default="openai",
        help="the function-calling dialect the definitions are written in (default openai)",
    )

    _add_ca_parser(commands)
    _add_redirect_parser(commands)
    return parser


def _settings_from(args: argparse.Namespace) -> Settings:

    flags = {
        name: getattr(args, name, None)
        for name in (
            "policy",
            "proxy_listen",
            "api_listen",
            "admin_listen",
            "nameservers",
            "ca_bundle",
            "redis_url",
            "audit_log",
            "log_level",
            "transparent_listen",
            "dns_listen",
            "gateway_uid",
            "exclude_cidrs",
            "exclude_ports",
            "inspect_ca_cert",
            "inspect_ca_key",
        )
    }
    config = getattr(args, "config", None) or os.environ.get("EGRESS_CONFIG")
    settings_file = read_settings_file(config) if config else None
    return load_settings(os.environ, flags, settings_file=settings_file)


def _without_settings(args: argparse.Namespace) -> int:
    """Commands that read no Settings: the policy tools and the tool definitions."""
    if args.command == "tools":
        from gateway.mcp_commands import print_tools  # noqa: PLC0415

        return print_tools(args.format)
    if args.command == "credentials":
        # 48 random bytes: the placeholder key needs at least 32 (`credentials/placeholders.py`).
        sys.stdout.write(secrets.token_urlsafe(48) + "\n")
        return EXIT_OK
    return _policy(args)


def _policy(args: argparse.Namespace) -> int:
    if args.policy_command == "lint":
        if not args.files and not args.diff:
            sys.stderr.write("usage: egress-gateway policy lint FILE [FILE ...] [--diff OLD NEW]\n")
            return EXIT_USAGE
        return commands.policy_lint(args.files, args.diff)
    if args.policy_command == "suggest":
        return commands.policy_suggest(
            args.sources,
            principal=args.principal,
            since=args.since,
            base_path=args.base,
            output=args.output,
            stdin=sys.stdin,
        )
    if args.policy_command == "hash-token":
        return commands.policy_hash_token(sys.stdin)
    return _policy_token()


def _connect_credential(path: str | None, variable: str, file_flag: str, on_command_line: str | None) -> str | None:
    """A `--connect` credential from its file, else its environment variable (never argv)."""
    if on_command_line is not None:
        raise GatewayError(
            ErrorCode.INVALID_INPUT,
            f"a token on the command line is readable by every user in the process list: "
            f"set ${variable} or pass a file with {file_flag}",
        )
    if path is None:
        return os.environ.get(variable) or None
    try:
        with open(path, encoding="utf-8") as handle:
            token = handle.read(MAX_TOKEN_FILE_BYTES + 1).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise GatewayError(ErrorCode.INVALID_INPUT, f"cannot read the token file {path}: {exc}") from None
    if not token or len(token) > MAX_TOKEN_FILE_BYTES or any(ch.isspace() for ch in token):
        raise GatewayError(ErrorCode.INVALID_INPUT, f"the token file {path} must hold one token on one line")
    return token


def _policy_token() -> int:
    from gateway.policy.decide import token_digest  # noqa: PLC0415

    token = secrets.token_urlsafe(32)
    sys.stdout.write(f"token: {token}\n")
    sys.stdout.write(f'token_sha256: "{token_digest(token)}"\n')
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    try:
        # The parser is not kept: `serve` runs for the life of the process.
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    if args.command in ("policy", "tools") or (args.command == "credentials" and args.credentials_command == "key"):
        return _without_settings(args)
    try:
        settings = _settings_from(args)
    except GatewayError as exc:
        sys.stderr.write(f"egress-gateway: {exc.message}\n")
        return EXIT_USAGE
    logging.basicConfig(
        level=settings.log_level.upper(),
        stream=sys.stderr,
        format='{"ts":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","msg":"%(message)s"}',
    )
    if args.command == "serve":
        return commands.serve(settings)
    if args.command == "check":
        return asyncio.run(commands.check(settings, args.url, args.principal, args.method))
    if args.command == "mcp":
        from gateway import mcp_commands as mcp_command  # noqa: PLC0415

        if args.connect:
            try:
                token = _connect_credential(
                    args.token_file, CONNECT_TOKEN_VARIABLE, "--token-file", args.token_on_command_line
                )
                run_token = _connect_credential(
                    args.run_token_file, CONNECT_RUN_TOKEN_VARIABLE, "--run-token-file", args.run_token_on_command_line
                )
            except GatewayError as exc:
                sys.stderr.write(f"egress-gateway: {exc.message}\n")
                return EXIT_USAGE
            return asyncio.run(mcp_command.bridge_stdio(args.connect, token, run_token))
        return asyncio.run(mcp_command.serve_stdio(settings, args.principal))
    if args.command == "redirect":
        return commands.redirect(settings, args.action, args.backend)
    return _one_shot(args, settings)


def _one_shot(args: argparse.Namespace, settings: Settings) -> int:
    """The commands that do one thing and exit: the CA tools, placeholders, fetch and search."""
    if args.command == "credentials":
        return commands.credential_placeholders(settings, args.format)
    if args.command == "ca":
        if args.ca_command == "init":
            return commands.ca_init(settings, args.days)
        return commands.ca_export(settings, args.ca_out, args.bundle_out)
    if args.command == "fetch":
        return asyncio.run(commands.fetch_once(settings, args.url, args.max_chars, args.offset))
    return asyncio.run(commands.search_once(settings, args.query, args.max_results))
