"""`make docs-ref`: the reference tables of docs/reference/ generated from the code's own tables.

Each generated table sits in its page between two marker comments; everything outside them is
written by hand. What comes from where:

- settings.md: the `EGRESS_*` names are the ones `gateway.settings` reads (recorded while it
  builds the defaults, the same record that refuses an unknown name), the flags are the CLI's
  settings flags that name a variable, the defaults come from the built `Settings`; the meaning of
  each name is written below in SETTINGS.
- cli.md: every command, argument and option from `gateway.cli.build_parser()`, with its help.
- error-codes.md: every `ErrorCode`, its status on the API and the proxy (`status_for`) and
  whether it is retryable (`RETRYABLE`); the meaning of each is written below in ERROR_MEANINGS.
- metrics.md: every metric defined in `gateway/observe/metrics.py` (read with `ast`, not by
  importing: the table is the source's), its type, labels and help string.
- audit-log.md: every field of `gateway/observe/audit.schema.json`, its type and values there;
  when it is present and what it means are written below in AUDIT_FIELDS.

A name the code has and the tables below lack (or the other way round) stops the generator with
a message naming it, so nothing is documented that does not exist and nothing exists undocumented.
`python scripts/gen_docs_ref.py --check` writes nothing and exits 1 when a page differs from what
the code generates (tests/docs/test_generated_reference.py runs that check).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway import cli, settings  # noqa: E402 - the repository root goes on the path first
from gateway.errors import RETRYABLE, RETRYABLE_STATUSES, ErrorCode, status_for  # noqa: E402

REFERENCE = ROOT / "docs" / "reference"
METRICS_SOURCE = ROOT / "gateway" / "observe" / "metrics.py"
AUDIT_SCHEMA = ROOT / "gateway" / "observe" / "audit.schema.json"


class MissingDocumentation(Exception):
    """The code names something these tables do not describe, or the other way round."""


# ---- settings ----------------------------------------------------------------------------------

# EGRESS_* name → (default when the Settings default does not say it well, meaning).
SETTINGS: dict[str, tuple[str | None, str]] = {
    "EGRESS_CONFIG": ("unset", "settings file (YAML, or TOML by its `.toml` suffix), as `--config`"),
    "EGRESS_CONNECT_TOKEN": ("unset", "`mcp --connect`: the bearer token sent to the gateway (or `--token-file`)"),
    "EGRESS_CONNECT_RUN_TOKEN": (
        "unset",
        "`mcp --connect`: the run token sent as `X-Egress-Run-Token` (or `--run-token-file`)",
    ),
    "EGRESS_POLICY": (None, "policy file (reloaded on SIGHUP and when the file changes)"),
    "EGRESS_PROXY_LISTEN": (None, "forward proxy (`host:port`; IPv6 bracketed, e.g. `[::1]:3128`)"),
    "EGRESS_API_LISTEN": (None, "tools API (`/v1/search`, `/v1/fetch`, `/v1/tools`, `/openapi.json`, `/mcp`)"),
    "EGRESS_ADMIN_LISTEN": (None, "`/healthz`, `/readyz`, `/metrics`"),
    "EGRESS_NAMESERVERS": ("system resolv.conf", "comma list of `IP[:port]` the gateway resolves with"),
    "EGRESS_CA_BUNDLE": ("certifi", "extra PEM trusted in addition to certifi"),
    "EGRESS_REDIS_URL": ("unset (in memory)", "shared budgets and search cache across replicas"),
    "EGRESS_REDIS_CA_BUNDLE": (
        "unset (system/certifi roots)",
        "PEM bundle that verifies a `rediss://` server (and its sentinels / cluster nodes)",
    ),
    "EGRESS_REDIS_MIN_REPLICAS": (
        None,
        "replicas that must acknowledge each reservation (Redis `WAIT`, 1 s) before it is granted; "
        "else `store_unavailable`",
    ),
    "EGRESS_RUN_TOKEN_SECRET": (
        "unset (random per process)",
        "HMAC secret of run tokens, at least 32 characters; every replica needs the same one "
        "([Run tokens](../concepts/budgets.md#run-tokens-post-v1runs-x-egress-run-token))",
    ),
    "EGRESS_AUDIT_LOG": ("`-` (stdout)", "`-`, a file path, or `off`"),
    "EGRESS_AUDIT_ON_FAILURE": (
        None,
        "`deny` refuses new egress while the audit log cannot be written; `allow` opts out",
    ),
    "EGRESS_AUDIT_MAX_BYTES": ("`0` (no bound)", "rotate the audit file past this size"),
    "EGRESS_AUDIT_KEEP_FILES": (None, "rotated audit files kept (`audit.log.1` …)"),
    "EGRESS_AUDIT_AGGREGATE_S": (
        None,
        "window in which identical denials are counted into one `repeated` line (`0` off)",
    ),
    "EGRESS_AUDIT_HTTP_PATHS": (
        "`on`",
        "`off` leaves the path out of plain HTTP audit lines (the query is never logged)",
    ),
    "EGRESS_LOG_LEVEL": (None, "`debug`, `info`, `warning`, `error` (logs go to stderr)"),
    "EGRESS_USER_AGENT": (None, "User-Agent of tool requests (engines may set their own)"),
    "EGRESS_SEARCH_ENGINES": ("`" + ",".join(settings.DEFAULT_ENGINES) + "`", "engines in the order tried"),
    "EGRESS_SEARCH_<ENGINE>_KEY": ("unset", "key of a keyed engine (`TAVILY`, `EXA`, `BRAVE_API`)"),
    "EGRESS_SEARCH_<ENGINE>_URL": (
        "the engine's public address",
        "retarget an engine (a mirror, a test origin); `SEARXNG` and `MEDIAWIKI` add those engines",
    ),
    "EGRESS_SEARCH_URL": ("unset", "the template engine's URL (`{query}`, `{limit}`)"),
    "EGRESS_SEARCH_KEY": ("unset", "the template engine's bearer key"),
    "EGRESS_FETCH_READER_URL": ("unset", "reader service for web_fetch (`{url}`)"),
    "EGRESS_FETCH_READER_KEY": ("unset", "the reader service's bearer key"),
    "EGRESS_EXTRACT_WORKERS": (None, "extraction worker processes (1 to 64), started on first use"),
    "EGRESS_EXTRACT_IDLE_EXIT_S": (None, "an extraction worker without work for this long exits"),
    "EGRESS_TRANSPARENT_LISTEN": (
        "unset (off)",
        "transparent TCP listener(s), comma list sharing one base port, e.g. `127.0.0.1:15001,[::1]:15001`; "
        "listed uids take base+1… ([Enforced sidecar](../guides/enforced-sidecar.md))",
    ),
    "EGRESS_DNS_LISTEN": (
        "unset (off)",
        "policy-aware DNS listener(s), UDP and TCP, e.g. `127.0.0.1:15053,[::1]:15053`",
    ),
    "EGRESS_GATEWAY_UID": (None, "the gateway's own uid, exempt from the redirect rules"),
    "EGRESS_REDIRECT_EXCLUDE_CIDRS": ("unset", "comma list of CIDRs the agent reaches without interception"),
    "EGRESS_REDIRECT_EXCLUDE_PORTS": ("unset", "comma list of TCP ports left alone by the rules"),
    "EGRESS_INSPECT_CA_CERT": (
        "unset (inspection off)",
        "PEM certificate of the interception CA that signs leaves for inspected hosts",
    ),
    "EGRESS_INSPECT_CA_KEY": ("unset", "PEM private key of that CA"),
    "EGRESS_INSPECT_LEAF_DIR": (
        "a fresh 0700 temporary directory",
        "where leaf certificate files live for the instant TLS loads them",
    ),
}

# Settings fields whose variable name is not `EGRESS_` + the field name in upper case.
_FIELD_OF = {"EGRESS_POLICY": "policy_path"}


def settings_read() -> set[str]:
    """The EGRESS_* names `gateway.settings` reads while it builds the defaults: the same record
    that refuses an unknown name. (A private helper of that module, used here on purpose: the list
    of known names is what the loader reads, never a copy.)"""
    recorder = settings._ReadRecorder({})
    settings._build(recorder, {})
    names = {name for name in recorder.read if name.startswith("EGRESS_")} | set(settings._CLI_VARIABLES)
    # Read by pattern (EGRESS_SEARCH_<ENGINE>_KEY / _URL), not by name.
    return names | {"EGRESS_SEARCH_<ENGINE>_KEY", "EGRESS_SEARCH_<ENGINE>_URL"}


def _default_text(value: Any) -> str:
    if value is None or value == ():
        return "unset"
    if isinstance(value, bool):
        return "`on`" if value else "`off`"
    if isinstance(value, tuple):
        return "`" + ",".join(str(item) for item in value) + "`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def settings_flags() -> dict[str, list[str]]:
    """EGRESS_* name → the flags that set it (`--policy`), read from the parser's help texts."""
    found: dict[str, list[str]] = {}
    for _, parser in walk_parsers(cli.build_parser(), ["egress-gateway"]):
        for action in parser._actions:
            for name in re.findall(r"\benv (EGRESS_[A-Z_]+)", action.help or ""):
                for flag in action.option_strings:
                    if flag not in found.setdefault(name, []):
                        found[name].append(flag)
    return found


def render_settings() -> str:
    read = settings_read()
    _require_same("setting", read, SETTINGS, "SETTINGS in scripts/gen_docs_ref.py")
    defaults = settings._build(settings._ReadRecorder({}), {})
    field_names = {field.name for field in fields(defaults)}
    flags = settings_flags()
    rows = []
    for name in sorted(SETTINGS, key=_setting_order):
        default, meaning = SETTINGS[name]
        field = _FIELD_OF.get(name, name.removeprefix("EGRESS_").lower())
        if default is None:
            if field not in field_names:
                raise MissingDocumentation(f"{name}: give its default in SETTINGS (no Settings.{field})")
            default = _default_text(getattr(defaults, field))
            if field == "policy_path":
                default = f"`{settings.DEFAULT_POLICY}`"
        file_key = "" if "<" in name or name in _CLI_ONLY else f"`{name.removeprefix('EGRESS_').lower()}`"
        flag = ", ".join(f"`{flag}`" for flag in flags.get(name, []))
        rows.append([f"`{name}`", file_key, flag, default, meaning])
    return table(["variable", "settings file key", "flag", "default", "meaning"], rows)


# Read by the CLI itself, never from a settings file.
_CLI_ONLY = frozenset({"EGRESS_CONFIG", "EGRESS_CONNECT_TOKEN", "EGRESS_CONNECT_RUN_TOKEN"})


def _setting_order(name: str) -> tuple[int, str]:
    return (list(SETTINGS).index(name), name)


# ---- CLI ---------------------------------------------------------------------------------------


def walk_parsers(
    parser: argparse.ArgumentParser, path: list[str]
) -> Iterable[tuple[list[str], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk_parsers(sub, [*path, name])


def _subcommand_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    helps: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                helps[choice.dest] = choice.help or ""
    return helps


def _argument_row(action: argparse.Action) -> list[str] | None:
    # A hidden flag (help=SUPPRESS) is one kept only to refuse with a message: not documented.
    if isinstance(action, argparse._HelpAction | argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
        return None
    if action.option_strings:
        metavar = ""
        if action.nargs != 0:
            shown = action.metavar or action.dest.upper()
            metavar = " " + (" ".join(shown) if isinstance(shown, tuple) else str(shown))
        name = ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)
    else:
        name = f"`{action.metavar or action.dest}`" + (" …" if action.nargs in ("*", "+") else "")
    notes = []
    if action.choices:
        notes.append("one of " + ", ".join(f"`{choice}`" for choice in action.choices))
    if (
        action.default not in (None, argparse.SUPPRESS, False)
        and action.nargs != 0
        and "default" not in (action.help or "")
    ):
        notes.append(f"default `{action.default}`")
    if isinstance(action, argparse._VersionAction):
        return [name, "print the version and exit"]
    if action.const is not None and not action.help:
        notes.insert(0, f"`{action.dest}` is `{action.const}`")
    help_text = (action.help or "").replace("|", "\\|")
    return [name, "; ".join(part for part in [help_text, *notes] if part)]


def _settings_flag_rows(parser: argparse.ArgumentParser) -> list[list[str]]:
    return [
        row for action in parser._actions if "env EGRESS_" in (action.help or "") and (row := _argument_row(action))
    ]


def render_cli() -> str:
    root = cli.build_parser()
    helps: dict[tuple[str, ...], str] = {}
    for path, parser in walk_parsers(root, ["egress-gateway"]):
        for name, text in _subcommand_help(parser).items():
            helps[(*path, name)] = text
    # The settings flags `serve` takes are shared by several commands: listed once, then named.
    shared = _settings_flag_rows(
        next(parser for path, parser in walk_parsers(root, ["egress-gateway"]) if path[-1] == "serve")
    )
    shared_names = {row[0] for row in shared}
    out: list[str] = []
    for path, parser in walk_parsers(root, ["egress-gateway"]):
        rows = [row for action in parser._actions if (row := _argument_row(action))]
        if shared_names <= {row[0] for row in rows}:
            rows = [["settings flags", "the [settings flags](#settings-flags): `--config`, `--policy`, ..."]] + [
                row for row in rows if row[0] not in shared_names
            ]
        has_commands = any(isinstance(action, argparse._SubParsersAction) for action in parser._actions)
        if has_commands and len(path) > 1 and not rows:
            continue  # `policy` only groups its commands
        out.append(f"### `{' '.join(path)}`")
        out.append("")
        summary = helps.get(tuple(path)) or parser.description or ""
        if summary:
            out += [summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
        if rows:
            out += [table(["argument", "meaning"], rows).rstrip("\n"), ""]
    out += [
        "### Settings flags",
        "",
        "Each sets the [setting](settings.md) its `EGRESS_*` variable names, and wins over it.",
        "",
        table(["argument", "meaning"], shared).rstrip("\n"),
    ]
    return "\n".join(out).rstrip() + "\n"


# ---- error codes -------------------------------------------------------------------------------

ERROR_MEANINGS: dict[str, str] = {
    "invalid_input": "argument missing, malformed or out of range; unknown field",
    "unsafe_url": "scheme, userinfo, IP-literal form or an IP literal under `literal_ips: deny`, a port not "
    "in `ports`, secret query parameter, length, internal name; the same code on the proxy, the API and `check`",
    "blocked_destination": "a resolved address is in a denied range (the range is named)",
    "policy_denied": "the principal may not reach this host or use this tool",
    "auth_required": "credential missing or wrong",
    "dns_failure": "NXDOMAIN, SERVFAIL, timeout, no usable answer",
    "connect_failure": "refused, reset, TLS failure (the certificate problem is named)",
    "redirect_blocked": "a hop failed validation, a downgrade, or too many hops",
    "too_large": "a wire, decoded, header or text cap was hit (which one in the message)",
    "unsupported_content": "binary, image, unknown encoding, an unreadable PDF",
    "challenged": "the page is a bot challenge (Cloudflare, captcha), not content",
    "robots_disallowed": "robots.txt disallows the URL and the policy respects it",
    "upstream_status": "the origin answered an HTTP error (`status` and `page` text included)",
    "timeout": "the deadline passed",
    "content_changed": "`expectedHash` differs from the page now",
    "quota_exhausted": "a step, run or window (minute, hour, day) budget is spent, or too many live run/step "
    "ids (`budget` names which)",
    "concurrency_limited": "too many active requests for this principal",
    "cooldown": "minimum interval between starts not yet passed (`Retry-After` set)",
    "rate_limited": "the upstream engine refused (429, challenge page)",
    "unavailable": "no engine produced results, or an unrecognised page shape",
    "store_unavailable": "Redis unreachable (budgets fail closed)",
    "policy_changed": "the policy changed while the call ran; the result was dropped",
    "invalid_run_token": "`X-Egress-Run-Token` forged, expired, another principal's, no longer vouched for, "
    "or contradicted by a header",
    "destination_mismatch": "transparent, `destination: strict`: the original address is not one of the "
    "name's vetted addresses",
    "protocol_unknown": "transparent: the first bytes are neither a TLS ClientHello nor HTTP, and no "
    "`raw_tcp` entry allows the destination",
    "audit_unavailable": "the audit log cannot be written and `EGRESS_AUDIT_ON_FAILURE` is `deny`",
    "host_mismatch": "an inspected request's `Host` or absolute authority is not the name its TLS connection "
    "was decided on (domain fronting)",
    "inspection_unsupported": "an inspected host was asked for a protocol interception does not speak "
    "(an HTTP/2-only ALPN, an upgrade request with a body)",
    "tls_untrusted": "the agent refused the gateway's certificate for an inspected host (the interception CA "
    "is not trusted)",
    "credential_misuse": "a credential placeholder outside its binding (URL, header, body window, `web_fetch` URL, "
    "`web_search` query, DNS name), or a held secret's real value in an outbound request "
    "([credentials](../guides/credentials.md))",
    "secret_detected": "the outbound scanner found a token format whose tier's action is `deny`; the audit line "
    "names the rule, never the text ([secret scanning](../guides/secret-scanning.md))",
}


def render_error_codes() -> str:
    codes = [code.value for code in ErrorCode]
    _require_same("error code", set(codes), ERROR_MEANINGS, "ERROR_MEANINGS in scripts/gen_docs_ref.py")
    rows = []
    for code in ErrorCode:
        api, proxy = status_for(code, "api"), status_for(code, "proxy")
        status = str(api) if api == proxy else f"{api} (proxy: {proxy})"
        retryable = "yes" if code in RETRYABLE else "no"
        if code == ErrorCode.UPSTREAM_STATUS:
            # GatewayError.retryable decides by the origin's status for this one code.
            retryable = "for 5xx, " + ", ".join(str(status) for status in sorted(RETRYABLE_STATUSES))
        rows.append([f"`{code.value}`", status, retryable, ERROR_MEANINGS[code.value]])
    return table(["code", "HTTP", "retryable", "meaning"], rows)


# ---- metrics -----------------------------------------------------------------------------------

METRIC_TYPES = {
    "Counter": "counter",
    "LoopCounter": "counter",
    "Gauge": "gauge",
    "Histogram": "histogram",
    "LoopHistogram": "histogram",
}


def metric_definitions() -> list[tuple[str, str, list[str], str]]:
    """(name, type, labels, help) of every metric constructed at the top of metrics.py, in order."""
    found = []
    for node in ast.parse(METRICS_SOURCE.read_text(encoding="utf-8")).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        call = node.value
        if not (isinstance(call.func, ast.Name) and call.func.id in METRIC_TYPES):
            continue
        keywords = {keyword.arg: keyword.value for keyword in call.keywords}
        name = ast.literal_eval(call.args[0] if call.args else keywords["name"])
        help_text = ast.literal_eval(call.args[1] if len(call.args) > 1 else keywords["documentation"])
        labels_node = call.args[2] if len(call.args) > 2 else keywords.get("labelnames")
        labels = list(ast.literal_eval(labels_node)) if labels_node is not None else []
        kind = METRIC_TYPES[call.func.id]
        if kind == "counter" and not name.endswith("_total"):
            name += "_total"
        found.append((name, kind, labels, help_text))
    return found


def render_metrics() -> str:
    rows = [
        [f"`{name}`", kind, ", ".join(labels), help_text.replace("|", "\\|")]
        for name, kind, labels, help_text in metric_definitions()
    ]
    return table(["metric", "type", "labels", "meaning"], rows)


# ---- audit log ---------------------------------------------------------------------------------

# Fields described together → (when present, meaning). Values a field may take come from the schema.
AUDIT_FIELDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("time",): (
        "every line",
        "RFC 3339 UTC with microseconds, `2026-12-01T11:07:26.123456Z` (not the application log's `ts`)",
    ),
    ("schema",): ("every line", "`1`; bumped only when a field changes meaning or type"),
    ("event",): (
        "every line",
        "what the line records: a decision, a close, aggregated denials (`repeated`), the log writable "
        "again (`audit_resumed`)",
    ),
    ("conn",): (
        "decision and close lines of every kind (not `repeated`, `audit_resumed`)",
        "id of the API request (or of a tool call over MCP stdio), of the proxy's or transparent listener's client "
        "connection, or of one DNS query, shared by its decision and close lines (on a kept-alive proxy connection, "
        "by every request on it), echoed in the `X-Egress-Id` response header (every tools API response, proxy "
        "refusals, the CONNECT `200`, forwarded plain-HTTP responses, transparent ones included)",
    ),
    ("client_ip", "client_port"): (
        "with `conn` (`client_ip` on `repeated` too)",
        "the client's address (for a DNS query, the querying socket's)",
    ),
    ("kind",): ("decision, close, repeated", "the surface the line is about"),
    ("principal",): ("once authenticated", "the principal's name (never its token)"),
    ("claimed_principal",): (
        "proxy `auth_required` lines with a Basic credential",
        "the user part the client claimed (never the token); `egress_gateway_auth_failures_total` counts the burst",
    ),
    ("host", "port"): ("once parsed", "destination host and port (never a query string)"),
    ("addresses",): ("proxy decisions", "the vetted addresses the name resolved to"),
    ("address",): (
        "proxy close lines (tunnels and plain HTTP that reached an upstream), fetch lines that got an answer",
        "the vetted address that was dialled (for a fetch: the last redirect hop's, or the reader service's)",
    ),
    ("decision",): (
        "decision, repeated",
        "the policy verdict; `would_deny` in report mode; `none` when no verdict was reached (a malformed "
        "request, `invalid_input`, a proxy request head too large to parse, a tool request whose body never "
        "arrived; such a line names no `rule`)",
    ),
    ("outcome",): ("close lines, tool lines, refusals", "what then happened"),
    ("code", "reason"): ("a denial or a failure", "the error code and its one-line reason"),
    ("generation",): (
        "decision and close lines",
        "policy generation the decision was made under (a close line repeats its decision's)",
    ),
    ("rule",): (
        "every decision line with a verdict (`allow`, `deny`, `would_deny`), `repeated`, and close lines (the "
        "rule the connection was allowed under)",
        "the rule or check that decided, named as in the policy file (`allow_domains[2]`, "
        "`defaults.deny_cidrs[0]`); the names are listed below",
    ),
    ("rule_pattern",): (
        "when the rule has a value",
        "that rule's value: a glob (`*.github.com`), a CIDR (`169.254.0.0/16`), a port list (`80,443`), "
        "a mode or a limit",
    ),
    ("run", "step"): (
        "tool lines with `X-Egress-Run`/`X-Egress-Step` (or a run token)",
        "the run and step ids the call named",
    ),
    ("run_vouched",): ("tool lines", "whether a run token vouched for `run` / `step` (only then did they count)"),
    ("orchestrator",): (
        "`kind: run_token` lines",
        "the orchestrator that minted a run token (`POST /v1/runs`); never the token or the run id",
    ),
    ("method", "path"): (
        "plain HTTP decision and close lines",
        "method, and the path without the query (`EGRESS_AUDIT_HTTP_PATHS=off` drops `path`)",
    ),
    ("status",): (
        "plain HTTP close lines once the upstream's response head was relayed",
        "the upstream's final status (a 502/504 the gateway wrote itself has none: see `close_reason`)",
    ),
    ("stage",): ("`sni` denials", "where a tunnel was refused after `200`"),
    ("original_dst",): ("transparent lines", "the address the agent dialed (`203.0.113.10:443`, `[2001:db8::10]:443`)"),
    ("seen",): ("transparent `protocol_unknown` denials", "the first bytes of the refused connection, printable"),
    ("qtype", "answers"): ("dns lines", "the query type and the number of answer records passed back"),
    ("duration_s",): ("tool and close lines", "time to answer / tunnel lifetime"),
    ("bytes_up", "bytes_down", "close_reason"): ("close lines", "bytes each way and why it closed"),
    ("upgrade",): (
        "inspect close lines of an upgrade request",
        "the protocol asked for (`websocket`); with `status` 101 the bytes count the relay's whole life",
    ),
    ("provider", "results", "attempts"): (
        "search",
        "the engine that answered, result count, each attempt's engine/tier/outcome/ms (never the query)",
    ),
    ("chars", "total_chars"): ("fetch", "characters returned and extracted"),
    ("count", "window_s"): ("`repeated`", "identical denials counted in the window after the first was written"),
    ("dropped", "failed_for_s"): (
        "`audit_resumed`",
        "lines lost while the destination failed (held lines are written, not lost) and for how long",
    ),
    ("action",): (
        "`security` lines",
        "`deny` (refused), `report` (allowed, findings noted), `inject` (a credential's value was injected), "
        "`scrub` (a value in a bound host's response was replaced by its placeholder)",
    ),
    ("findings",): (
        "`security` deny and report lines",
        "each finding's `rule`, `tier`, `where` (`url`, `header`, `body`, `query`, `dns`), `header`, `offset` and, "
        "for tier 1, `credential`; never the matched text ([secret scanning](../guides/secret-scanning.md))",
    ),
    ("credential", "injected_into", "scrubbed"): (
        "`security` inject and scrub lines",
        "the credential's name (never its value or placeholder), the header the value went into, how many "
        "occurrences were replaced ([credentials](../guides/credentials.md))",
    ),
}


def _schema_type(spec: dict[str, Any]) -> str:
    if "const" in spec:
        return f"`{json.dumps(spec['const'])}`"
    if "enum" in spec:
        return "one of " + ", ".join(f"`{value}`" for value in spec["enum"])
    kind = spec.get("type", "any")
    if kind == "array":
        return f"array of {spec.get('items', {}).get('type', 'any')}s"
    return str(kind)


def render_audit_fields() -> str:
    schema = json.loads(AUDIT_SCHEMA.read_text(encoding="utf-8"))
    properties: dict[str, dict[str, Any]] = schema["properties"]
    described = {name for group in AUDIT_FIELDS for name in group}
    _require_same("audit field", set(properties), described, "AUDIT_FIELDS in scripts/gen_docs_ref.py")
    rows = []
    for group, (when, meaning) in AUDIT_FIELDS.items():
        names = ", ".join(f"`{name}`" for name in group)
        types = "; ".join(_schema_type(properties[name]) for name in group)
        rows.append([names, types, when, meaning])
    return table(["field", "type", "when present", "meaning"], rows)


# ---- pages -------------------------------------------------------------------------------------

RENDERERS: dict[str, Callable[[], str]] = {
    "settings": render_settings,
    "cli": render_cli,
    "error-codes": render_error_codes,
    "metrics": render_metrics,
    "audit-fields": render_audit_fields,
}
PAGES: dict[str, tuple[str, ...]] = {
    "settings.md": ("settings",),
    "cli.md": ("cli",),
    "error-codes.md": ("error-codes",),
    "metrics.md": ("metrics",),
    "audit-log.md": ("audit-fields",),
}


def begin_marker(name: str) -> str:
    return f"<!-- BEGIN generated {name}: scripts/gen_docs_ref.py writes this part; run `make docs-ref` -->"


def end_marker(name: str) -> str:
    return f"<!-- END generated {name} -->"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("\n", " ") for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _require_same(what: str, in_code: set[str], documented: Iterable[str], where: str) -> None:
    documented = set(documented)
    missing = sorted(in_code - documented)
    stale = sorted(documented - in_code)
    problems = [f"{what} {name} is not described in {where}" for name in missing]
    problems += [f"{where} describes {what} {name}, which the code does not have" for name in stale]
    if problems:
        raise MissingDocumentation("\n".join(problems))


def with_region(text: str, name: str, content: str, page: str) -> str:
    begin, end = begin_marker(name), end_marker(name)
    if begin not in text or end not in text:
        raise MissingDocumentation(f"docs/reference/{page} has no {begin!r} … {end!r} markers")
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n\n{content.rstrip()}\n\n{end}{tail}"


def generated_pages() -> dict[Path, str]:
    """Each reference page as the code says it should read."""
    pages = {}
    for page, regions in PAGES.items():
        path = REFERENCE / page
        text = path.read_text(encoding="utf-8")
        for name in regions:
            text = with_region(text, name, RENDERERS[name](), page)
        pages[path] = text
    return pages


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")
    args = parser.parse_args(argv)
    try:
        pages = generated_pages()
    except MissingDocumentation as exc:
        print(f"gen_docs_ref: {exc}", file=sys.stderr)
        return 2
    stale = [path for path, text in pages.items() if path.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} differs from what the code generates: run `make docs-ref`")
        return 1 if stale else 0
    for path in stale:
        path.write_text(pages[path], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
