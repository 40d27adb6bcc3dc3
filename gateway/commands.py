"""What each CLI command does, given Settings: serve the daemon, check a URL, run a tool once."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

import orjson
import yarl

from gateway.credentials.store import SecretStore
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.load import PolicyError, load_policy_file
from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.app import Gateway
    from gateway.policy.model import Policy, Principal
    from gateway.tools.api import ToolsApi
    from gateway.vet.urls import VettedUrl

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_DENIED = 3


def _emit(value: object) -> None:
    """One JSON object on one line, for scripts and jq."""
    sys.stdout.write(orjson.dumps(value).decode() + "\n")


def serve(settings: Settings) -> int:
    from gateway.app import run_daemon  # noqa: PLC0415

    try:
        run_daemon(settings)
    except PolicyError as exc:
        for line in exc.errors:
            sys.stderr.write(line + "\n")
        return EXIT_INVALID
    except GatewayError as exc:
        sys.stderr.write(f"egress-gateway: {exc.message}\n")
        return EXIT_USAGE
    except OSError as exc:
        sys.stderr.write(f"egress-gateway: cannot start: {exc}\n")
        return EXIT_USAGE
    return EXIT_OK


async def check(settings: Settings, url: str, principal_name: str | None, method: str | None = None) -> int:
    """Resolve and decide without connecting; one JSON object on stdout."""
    from gateway.egress.own_addresses import own_addresses  # noqa: PLC0415
    from gateway.egress.resolver import Resolver  # noqa: PLC0415
    from gateway.egress.target import EgressCore  # noqa: PLC0415
    from gateway.policy.decide import vet_url_for  # noqa: PLC0415
    from gateway.policy.holder import FixedPolicy  # noqa: PLC0415
    from gateway.policy.load import load_policy_file  # noqa: PLC0415
    from gateway.policy.model import LoadedPolicy  # noqa: PLC0415

    try:
        policy = load_policy_file(settings.policy_path)
    except PolicyError as exc:
        sys.stderr.write("\n".join(exc.errors) + "\n")
        return EXIT_USAGE
    loaded = LoadedPolicy(policy, 1)
    principal = policy.principals.get(principal_name) if principal_name else policy.default_principal
    if principal is None:
        # A name the policy does not have is a mistake in the command, not a denial (exit 2).
        known = ", ".join(sorted(policy.principals)) or "none"
        wanted = principal_name or "default"
        sys.stderr.write(f"egress-gateway: no principal {wanted!r} in the policy (it has: {known})\n")
        return EXIT_USAGE
    result: dict[str, object] = {"allowed": False, "code": None, "reason": "", "host": None, "addresses": []}
    resolver = Resolver(settings.nameservers, timeout_s=settings.dns_timeout_s)
    try:
        # The very checks web_fetch makes on its URL argument (secret query parameters included),
        # then the egress core's decision: check and /v1/fetch cannot disagree.
        vetted = vet_url_for(policy, url)
        result["host"] = vetted.host.name
        core = EgressCore(
            resolver, FixedPolicy(loaded), own_addresses(listen.host for listen in settings.listen_addresses)
        )
        if method is not None:
            _judge_request(result, policy, principal, vetted, method)
        target = await core.pin(principal, vetted.host, vetted.port)
        result["addresses"] = list(target.address_texts)
        if target.would_deny is not None:
            result.update(
                code=str(target.would_deny.code), reason=f"report mode, would deny: {target.would_deny.message}"
            )
            result["allowed"] = True
        else:
            result.update(allowed=True, reason=f"{vetted.host.name}:{vetted.port} allowed for {principal.name}")
    except GatewayError as exc:
        result.update(allowed=False, code=str(exc.code), reason=exc.message)
        if exc.addresses:
            result["addresses"] = list(exc.addresses)
        if result["host"] is None:
            result["host"] = _raw_host(url)
    finally:
        await resolver.close()
    _emit(result)
    return EXIT_OK if result["allowed"] else EXIT_DENIED


def _judge_request(
    result: dict[str, object], policy: Policy, principal: Principal, vetted: VettedUrl, method: str
) -> None:
    """The request rules' verdict on METHOD URL (`check --method`): the rule id it names, and a
    refusal raised as the daemon would answer it."""
    from gateway.policy.inspect_decide import RequestFacts, decide_request  # noqa: PLC0415

    facts = RequestFacts(vetted.host.name, vetted.port, vetted.scheme == "https", method.upper(), vetted.target)
    verdict = decide_request(policy, principal, facts)
    result.update(method=method.upper(), inspected=verdict.inspected, rule=verdict.rule, verdict=verdict.verdict)
    if verdict.verdict == "deny":
        raise GatewayError(verdict.code or ErrorCode.POLICY_DENIED, verdict.reason, rule=verdict.rule)


def _raw_host(url: str) -> str | None:
    """The host as written, for a report on a URL the guard refused before canonicalising it."""
    try:
        return yarl.URL(url).raw_host
    except (ValueError, TypeError, UnicodeError, IndexError):
        return None


def in_process_tools(settings: Settings) -> tuple[Gateway, ToolsApi] | int:
    """The daemon's wiring with no listener, for a command that runs the tools itself.

    An exit code, with the reason on stderr, when the policy or a setting stops it being built.
    """
    from gateway.app import Gateway  # noqa: PLC0415 - the daemon's wiring, only for these commands

    try:
        gateway = Gateway(settings)
        gateway.build_core()
        return gateway, gateway.tools_api()
    except PolicyError as exc:
        sys.stderr.write("\n".join(exc.errors) + "\n")
        return EXIT_INVALID
    except GatewayError as exc:
        sys.stderr.write(f"egress-gateway: {exc.message}\n")
        return EXIT_USAGE


async def _run_tool_once(settings: Settings, tool: str, payload: dict[str, object]) -> tuple[int, dict[str, Any]]:
    """Run one tool call as the default principal; (exit code, result) with errors printed."""
    from gateway.tools.call_guard import CallContext  # noqa: PLC0415

    built = in_process_tools(settings)
    if isinstance(built, int):
        return built, {}
    gateway, api = built
    try:
        loaded = gateway.policy.current
        principal = loaded.policy.default_principal
        if principal is None:
            raise GatewayError(ErrorCode.AUTH_REQUIRED, "the policy has no default principal for the terminal")
        return EXIT_OK, await api.invoke(tool, CallContext(principal, loaded, None, None), payload, {})
    except GatewayError as exc:
        sys.stderr.write(f"{exc.code}: {exc.message}\n")
        return EXIT_DENIED, {}
    finally:
        await gateway.shutdown()


async def fetch_once(settings: Settings, url: str, max_chars: int, offset: int = 0) -> int:
    """Print one page as markdown (the content window), with the command that reads on."""
    status, result = await _run_tool_once(settings, "fetch", {"url": url, "maxChars": max_chars, "offset": offset})
    if status != EXIT_OK:
        return status
    sys.stdout.write(str(result["content"]) + "\n")
    if result["nextOffset"] is not None:
        sys.stderr.write(
            f"(truncated at {result['nextOffset']} of {result['totalChars']} characters: read on with "
            f"--offset {result['nextOffset']})\n"
        )
    return EXIT_OK


async def search_once(settings: Settings, query: str, max_results: int) -> int:
    """Print one search as a numbered list."""
    status, result = await _run_tool_once(settings, "search", {"query": query, "maxResults": max_results})
    if status != EXIT_OK:
        return status
    sys.stdout.write(f"provider: {result['provider']}\n")
    for index, hit in enumerate(result["results"], 1):
        sys.stdout.write(f"{index}. {hit['title']}\n   {hit['url']}\n   {hit['snippet']}\n")
    return EXIT_OK


def redirect(settings: Settings, action: str, backend: str) -> int:
    """Print, apply or remove the interception rules (nftables, or iptables where nft is missing)."""
    from gateway.redirect import apply as rules_apply  # noqa: PLC0415
    from gateway.redirect.plan import build_plan  # noqa: PLC0415

    try:
        if action == "remove":
            rules_apply.remove_nft() if backend == "nftables" else rules_apply.remove_iptables()
            return EXIT_OK
        from gateway.policy.load import load_policy_file  # noqa: PLC0415

        try:
            policy = load_policy_file(settings.policy_path)
        except PolicyError as exc:
            sys.stderr.write("\n".join(exc.errors) + "\n")
            return EXIT_INVALID
        plan = build_plan(settings, policy)
        commands = rules_apply.install_commands(plan, backend)
        if action == "print":
            sys.stdout.write(rules_apply.as_shell(commands))
            return EXIT_OK
        rules_apply.run_commands(commands)
    except GatewayError as exc:
        sys.stderr.write(f"egress-gateway: {exc.message}\n")
        return EXIT_INVALID if exc.code != ErrorCode.INVALID_INPUT else EXIT_USAGE
    return EXIT_OK


def policy_lint(paths: list[str], diff: list[str] | None) -> int:
    """Validate each file (every problem as file:line); with `diff`, also print what NEW changes."""
    from gateway.policy.diff import describe_changes  # noqa: PLC0415
    from gateway.policy.inspect_lint import describe_inspect_changes, lint_inspect  # noqa: PLC0415
    from gateway.policy.load import load_policy_file  # noqa: PLC0415

    loaded: dict[str, Policy] = {}
    status = EXIT_OK
    for path in [*paths, *(diff or [])]:
        if path in loaded:
            continue
        try:
            loaded[path] = load_policy_file(path)
        except PolicyError as exc:
            for line in exc.errors:
                sys.stderr.write(line + "\n")
            status = EXIT_INVALID
            continue
        sys.stdout.write(f"{path}: valid, {len(loaded[path].principals)} principal(s)\n")
        # Rules that can never decide are warnings: the file still loads and enforces.
        for line in lint_inspect(loaded[path]):
            sys.stdout.write(line + "\n")
    if diff and status == EXIT_OK:
        old, new = diff
        changes = describe_changes(loaded[old], loaded[new]) + describe_inspect_changes(loaded[old], loaded[new])
        sys.stdout.write(f"{old} → {new}: " + (f"{len(changes)} change(s)\n" if changes else "no change\n"))
        for line in changes:
            sys.stdout.write(f"  {line}\n")
    return status


def credential_placeholders(settings: Settings, output: str) -> int:
    """Print every credential's placeholder, as `VARIABLE=placeholder` lines for the agent's
    environment or as JSON. Reads the policy and the placeholder key, never prints a real value."""
    try:
        policy = load_policy_file(settings.policy_path)
        store = SecretStore(settings.secret_env)
        store.load(policy.credentials)
    except PolicyError as exc:
        sys.stderr.write("\n".join(exc.errors) + "\n")
        return 1
    except GatewayError as exc:
        sys.stderr.write(f"egress-gateway: {exc.message}\n")
        return 1
    pairs = store.placeholders()
    if output == "json":
        _emit({rule.name: {"env": rule.agent_variable, "placeholder": placeholder} for rule, placeholder in pairs})
        return 0
    for rule, placeholder in pairs:
        sys.stdout.write(f"{rule.agent_variable}={placeholder}\n")
    return 0


def ca_init(settings: Settings, days: int) -> int:
    """Write a new interception CA to EGRESS_INSPECT_CA_CERT and its key (0600) to EGRESS_INSPECT_CA_KEY."""
    from pathlib import Path  # noqa: PLC0415

    from gateway.inspect.authority import create_authority, write_authority  # noqa: PLC0415

    if not settings.inspect_ca_cert or not settings.inspect_ca_key:
        sys.stderr.write("egress-gateway: ca init needs --inspect-ca-cert and --inspect-ca-key (or their env)\n")
        return EXIT_USAGE
    if not 1 <= days <= 3650:
        sys.stderr.write("egress-gateway: --days must be between 1 and 3650\n")
        return EXIT_USAGE
    try:
        write_authority(create_authority(days=days), Path(settings.inspect_ca_cert), Path(settings.inspect_ca_key))
    except GatewayError as exc:
        sys.stderr.write(f"egress-gateway: {exc.message}\n")
        return EXIT_USAGE
    except OSError as exc:
        sys.stderr.write(f"egress-gateway: cannot write the CA: {exc}\n")
        return EXIT_USAGE
    _emit({"certificate": settings.inspect_ca_cert, "key": settings.inspect_ca_key, "days": days})
    return EXIT_OK


def ca_export(settings: Settings, ca_out: str, bundle_out: str) -> int:
    """The CA alone and the gateway's trust roots (certifi, EGRESS_CA_BUNDLE) plus the CA."""
    from pathlib import Path  # noqa: PLC0415

    import certifi  # noqa: PLC0415

    from gateway.inspect.authority import export_bundles, load_authority  # noqa: PLC0415

    if not settings.inspect_ca_cert or not settings.inspect_ca_key:
        sys.stderr.write("egress-gateway: ca export needs --inspect-ca-cert and --inspect-ca-key (or their env)\n")
        return EXIT_USAGE
    try:
        authority = load_authority(settings.inspect_ca_cert, settings.inspect_ca_key)
        roots = Path(certifi.where()).read_bytes()
        if settings.ca_bundle:
            roots = roots.rstrip(b"\n") + b"\n" + Path(settings.ca_bundle).read_bytes()
        export_bundles(authority.pem, roots, Path(ca_out), Path(bundle_out))
    except GatewayError as exc:
        sys.stderr.write(f"egress-gateway: {exc.message}\n")
        return EXIT_USAGE
    except OSError as exc:
        sys.stderr.write(f"egress-gateway: cannot export: {exc}\n")
        return EXIT_USAGE
    _emit({"ca": ca_out, "bundle": bundle_out})
    return EXIT_OK


def policy_hash_token(stdin: TextIO) -> int:
    """The token_sha256 line for a token read from stdin (one trailing newline ignored)."""
    from gateway.policy.decide import token_digest  # noqa: PLC0415

    token = stdin.read()
    token = token[:-1] if token.endswith("\n") else token
    token = token[:-1] if token.endswith("\r") else token
    if not token or token != token.strip():
        sys.stderr.write("egress-gateway: give the token on stdin, without surrounding whitespace\n")
        return EXIT_USAGE
    sys.stdout.write(f'token_sha256: "{token_digest(token)}"\n')
    return EXIT_OK


def policy_suggest(
    sources: list[str],
    *,
    principal: str | None,
    since: str | None,
    base_path: str | None,
    output: str | None,
    stdin: TextIO,
) -> int:
    """Learn mode: the smallest policy that would have allowed what the audit lines saw.

    The policy goes to stdout (or `output`) with the review as leading `#` comments; with
    `output`, the review is printed instead. With a base, the review ends with what the suggestion
    opens or closes against it, in `policy lint --diff` words.
    """
    from datetime import UTC, datetime  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    from gateway.policy.diff import describe_changes  # noqa: PLC0415
    from gateway.policy.load import load_policy_file, parse_policy  # noqa: PLC0415
    from gateway.policy.suggest import parse_audit_lines, parse_since, review_lines, suggest  # noqa: PLC0415

    try:
        since_time = parse_since(since, datetime.now(UTC)) if since is not None else None
    except GatewayError as exc:
        sys.stderr.write(f"egress-gateway: {exc.message}\n")
        return EXIT_USAGE
    base_policy = None
    base_document = None
    if base_path is not None:
        try:
            base_policy = load_policy_file(base_path)
            with open(base_path, encoding="utf-8") as handle:
                base_document = yaml.safe_load(handle)
        except PolicyError as exc:
            sys.stderr.write("\n".join(exc.errors) + "\n")
            return EXIT_INVALID
    lines: list[bytes] = []
    for source in sources:
        try:
            if source == "-":
                lines += stdin.buffer.read().splitlines()
            else:
                with open(source, "rb") as handle:
                    lines += handle.read().splitlines()
        except OSError as exc:
            sys.stderr.write(f"egress-gateway: cannot read the audit log {source}: {exc.strerror or exc}\n")
            return EXIT_USAGE
    entries, skipped = parse_audit_lines(lines)
    if skipped and not entries:
        sys.stderr.write(f"egress-gateway: {', '.join(sources)}: no audit lines ({skipped} line(s) not audit JSON)\n")
        return EXIT_USAGE
    suggestion = suggest(entries, base=base_document, principal=principal, since=since_time, skipped_lines=skipped)
    text = yaml.safe_dump(suggestion.document, sort_keys=False, default_flow_style=False)
    try:
        # The suggestion must be a policy `serve` accepts; a failure here is this command's bug.
        suggested = parse_policy(text, "<suggested policy>")
    except PolicyError as exc:
        sys.stderr.write("egress-gateway: the suggested policy does not validate:\n" + "\n".join(exc.errors) + "\n")
        return EXIT_INVALID
    review = review_lines(suggestion, ", ".join(sources))
    if base_policy is not None:
        changes = describe_changes(base_policy, suggested)
        review.append(f"{base_path} → suggestion: " + (f"{len(changes)} change(s)" if changes else "no change"))
        review += [f"  {line}" for line in changes]
    if output is None:
        sys.stdout.write("".join(f"# {line}\n" for line in review) + text)
        return EXIT_OK
    try:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        sys.stderr.write(f"egress-gateway: cannot write {output}: {exc.strerror or exc}\n")
        return EXIT_USAGE
    sys.stdout.write("".join(f"{line}\n" for line in review))
    return EXIT_OK
