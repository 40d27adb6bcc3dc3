"""Every command in the README's `sh` blocks is run here, as written, and does what its comment says.

The README is what a newcomer copies first, so its commands are read out of the file (fenced
`sh` blocks, `\\` continuations joined) and each is matched to a runner below; a command no runner
knows fails the test, so a new README command needs a runner before it lands.

- `make demo` runs what its recipe runs (`scripts/demo.py`, checked with `make -n`): the real
  gateway beside a local origin and DNS server. Every line of the README's sample output must
  appear in the real output once ports, numbers and temporary paths are masked.
- `.venv/bin/egress-gateway ...` runs the installed console script in a temporary directory
  holding the README's `my-policy.yaml` block. A trailing `# exit N: word` comment is the expected
  exit status and a word the output must hold; any other comment is output it must print.
  `serve` runs until `/readyz` answers 200 (on free ports, through the `EGRESS_*_LISTEN`
  settings, which the command's flags leave alone) and must then stop cleanly on SIGTERM.
- `make run` and `make test` are dry-run (`make -n`): `make test` is what CI runs, so running it
  from inside itself would recurse, and `make run` serves on fixed ports until stopped, which
  would collide with any gateway already on this machine. What they install is checked by
  `tests/unit/test_makefile.py`, and the daemon `make run` starts is the one `serve` runs here.

The client recipe table holds settings, not commands: which client reads which variable is shown
by `tests/integration/test_client_recipes.py`, which drives each one through a gateway.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.gateway import free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CONSOLE_SCRIPT = Path(sys.executable).parent / "egress-gateway"
DEMO_TIMEOUT_S = 90
COMMAND_TIMEOUT_S = 30
READY_TIMEOUT_S = 20.0

FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True, slots=True)
class Command:
    text: str
    comment: str


def fenced_blocks_any() -> Iterator[tuple[str, list[str]]]:
    """(language, lines) for every fenced block, in order."""
    language = ""
    block: list[str] | None = None
    for line in README.read_text(encoding="utf-8").splitlines():
        if block is None:
            match = FENCE.match(line)
            if match:
                language, block = match.group(1), []
        elif line.startswith("```"):
            yield language, block
            block = None
        else:
            block.append(line)


def readme_commands() -> list[Command]:
    commands = []
    for language, block in fenced_blocks_any():
        if language != "sh":
            continue
        joined = "\n".join(block).replace("\\\n", " ")
        for line in joined.splitlines():
            code, _, comment = line.partition(" #")
            if code.strip() and not code.lstrip().startswith("#"):
                commands.append(Command(" ".join(code.split()), comment.strip()))
    return commands


def readme_block(language: str, first_line: str | None = None) -> str:
    for block_language, block in fenced_blocks_any():
        if block_language == language and (first_line is None or (block and block[0].strip() == first_line)):
            return "\n".join(block) + "\n"
    raise AssertionError(f"the README has no {language} block starting {first_line!r}")


def mask(text: str) -> list[str]:
    """Lines with what differs from run to run made constant: temporary paths, numbers, spacing."""
    text = re.sub(r"/tmp/[^\s;)]+", "PATH", text)
    text = re.sub(r"\d+", "N", text)
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def dry_run(target: str) -> str:
    make = shutil.which("make")
    assert make is not None, "make is not installed"
    result = subprocess.run(
        [make, "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=True
    )
    return result.stdout


def run_make(command: Command) -> None:
    target = command.text.split()[1]
    recipe = dry_run(target)
    if target == "run":
        assert "egress-gateway serve --policy policies/default.yaml" in recipe
    elif target == "test":
        assert "-m pytest" in recipe
    elif target == "demo":
        assert "scripts/demo.py" in recipe
        run_demo()
    else:
        raise AssertionError(f"no runner for `{command.text}`")


def run_demo() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    shown = mask(readme_block("text"))
    got = mask(result.stdout)
    missing = [line for line in shown if line not in got]
    assert missing == [], (
        "README sample lines the demo did not print:\n" + "\n".join(missing) + "\n---\n" + result.stdout
    )


def expectation(comment: str) -> tuple[int, str]:
    """`exit 3: policy_denied` → (3, "policy_denied"); other text → (0, that text)."""
    match = re.match(r"^exit (\d+)(?::\s*(.*))?$", comment)
    if match:
        return int(match.group(1)), (match.group(2) or "").strip()
    return 0, comment


def run_console_script(command: Command, workdir: Path) -> None:
    assert CONSOLE_SCRIPT.exists(), f"{CONSOLE_SCRIPT} is not installed"
    argv = shlex.split(command.text)
    assert argv[0] == ".venv/bin/egress-gateway"
    argv[0] = str(CONSOLE_SCRIPT)
    if "serve" in argv:
        serve_until_ready(argv, workdir)
        return
    result = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    status, text = expectation(command.comment)
    assert result.returncode == status, f"`{command.text}`: exit {result.returncode}\n{result.stdout}{result.stderr}"
    assert text in result.stdout, f"`{command.text}` did not print {text!r}:\n{result.stdout}"


def serve_until_ready(argv: list[str], workdir: Path) -> None:
    admin_port = free_port()
    env = dict(os.environ)
    env.update(
        {
            "EGRESS_PROXY_LISTEN": f"127.0.0.1:{free_port()}",
            "EGRESS_API_LISTEN": f"127.0.0.1:{free_port()}",
            "EGRESS_ADMIN_LISTEN": f"127.0.0.1:{admin_port}",
            "EGRESS_AUDIT_LOG": str(workdir / "audit.log"),
            "EGRESS_SEARCH_ENGINES": "duckduckgo",
        }
    )
    stderr_path = workdir / "serve.stderr"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        ready = False
        while not ready and time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/readyz", timeout=2) as response:
                    ready = response.status == 200
            except (OSError, urllib.error.URLError):
                time.sleep(0.05)
        assert ready, f"`serve` never became ready:\n{stderr_path.read_text()}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr_path.read_text()


def test_the_readme_has_the_commands_a_newcomer_needs() -> None:
    texts = [command.text for command in readme_commands()]
    assert "make run" in texts
    assert "make test" in texts
    assert "make demo" in texts
    assert any(text.startswith(".venv/bin/egress-gateway policy lint") for text in texts)
    assert any(text.startswith(".venv/bin/egress-gateway check") for text in texts)
    assert any(text.startswith(".venv/bin/egress-gateway serve") for text in texts)


def test_the_readmes_stay_short() -> None:
    # The front page and the bench page point elsewhere for detail (docs/, bench/HISTORY.md).
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250
    assert len((ROOT / "bench" / "README.md").read_text(encoding="utf-8").splitlines()) <= 200


@pytest.mark.slow
def test_every_readme_command_runs_as_its_comment_says(tmp_path: Path) -> None:
    (tmp_path / "my-policy.yaml").write_text(readme_block("yaml", "# my-policy.yaml"))
    for command in readme_commands():
        if command.text.startswith("make "):
            run_make(command)
        elif command.text.startswith(".venv/bin/egress-gateway "):
            run_console_script(command, tmp_path)
        else:
            raise AssertionError(f"no runner for README command `{command.text}`: add one to {Path(__file__).name}")
