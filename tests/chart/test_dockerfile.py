"""The image recipe has the properties the runtime relies on. Docker cannot build here, so the
Dockerfile is parsed (continuations joined, comments dropped) and its instructions checked."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import pytest

from .conftest import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
BUILD_TOOLS = re.compile(r"\b(build-essential|gcc|g\+\+|make|clang|python3-dev|libc6-dev)\b")


@dataclass(frozen=True, slots=True)
class Instruction:
    keyword: str
    args: str


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def args_of(self, keyword: str) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == keyword]


def parse_dockerfile(text: str) -> list[Stage]:
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "dangling line continuation"
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        args = args.strip()
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", args, flags=re.IGNORECASE)
            assert match, line
            stages.append(Stage(base=match[1], name=match[2]))
        else:
            assert stages, f"{keyword} before FROM"
            stages[-1].instructions.append(Instruction(keyword, args))
    return stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


def test_multi_stage_build_on_python_311_slim(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    assert all(stage.base == "python:3.11-slim" for stage in stages)


def test_final_stage_copies_the_venv_from_the_build_stage(stages: list[Stage]) -> None:
    build_names = {stage.name for stage in stages[:-1]}
    copies = stages[-1].args_of("COPY")
    venv_copies = [c for c in copies if c.startswith("--from=") and "/opt/venv" in c]
    assert venv_copies, copies
    assert venv_copies[0].split()[0].removeprefix("--from=") in build_names
    build_runs = " ".join(r for stage in stages[:-1] for r in stage.args_of("RUN"))
    assert "venv /opt/venv" in build_runs


def test_bytecode_is_compiled_into_the_image(stages: list[Stage]) -> None:
    # The root filesystem is read-only at run time: .pyc files must already exist.
    runs = " ".join(stages[-1].args_of("RUN"))
    assert "compileall" in runs
    assert "/opt/venv" in runs.split("compileall", 1)[1]
    env = " ".join(stages[-1].args_of("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env


def test_runs_as_numeric_non_root_user_65532(stages: list[Stage]) -> None:
    users = stages[-1].args_of("USER")
    assert users, "no USER in the final stage"
    assert re.fullmatch(r"65532(:65532)?", users[-1])


def test_entrypoint_is_exec_form_serve_without_a_shell(stages: list[Stage]) -> None:
    final = stages[-1]
    [entrypoint] = final.args_of("ENTRYPOINT")
    argv = json.loads(entrypoint)
    assert argv == ["/opt/venv/bin/egress-gateway", "serve"]
    assert not final.args_of("CMD")
    assert not any(word in entrypoint for word in ("/bin/sh", "bash", "tini", "dumb-init"))


def test_exposes_proxy_api_and_admin_ports(stages: list[Stage]) -> None:
    exposed = {port for args in stages[-1].args_of("EXPOSE") for port in args.split()}
    assert exposed == {"3128", "8080", "9090"}


def test_final_stage_has_no_build_tools_and_no_pip_cache(stages: list[Stage]) -> None:
    final = stages[-1]
    for run in final.args_of("RUN"):
        # Runtime packages only: nftables for the transparent init container's `redirect --apply`.
        assert "apt-get install" not in run.replace("apt-get install -y --no-install-recommends nftables", ""), run
        assert not BUILD_TOOLS.search(run), run
        if "pip install" in run:
            assert "--no-cache-dir" in run, run
    copies = " ".join(final.args_of("COPY"))
    assert "/root/.cache" not in copies
    # The build stage must not leave a pip cache in the venv it hands over either.
    build_env = " ".join(e for stage in stages[:-1] for e in stage.args_of("ENV"))
    build_pip = [r for stage in stages[:-1] for r in stage.args_of("RUN") if "pip install" in r]
    assert "PIP_NO_CACHE_DIR=1" in build_env or all("--no-cache-dir" in r for r in build_pip)


def test_listeners_bind_all_interfaces_by_default_in_the_image(stages: list[Stage]) -> None:
    env = " ".join(stages[-1].args_of("ENV"))
    for name, port in (("PROXY", 3128), ("API", 8080), ("ADMIN", 9090)):
        assert f"EGRESS_{name}_LISTEN=0.0.0.0:{port}" in env


def test_dockerignore_keeps_the_context_to_sources() -> None:
    patterns = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "**", "the context should be an allowlist"
    allowed = {p.removeprefix("!").rstrip("/") for p in patterns if p.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "gateway", "policies"}


def test_sources_the_dockerfile_copies_are_in_the_context(stages: list[Stage]) -> None:
    allowed = {"pyproject.toml", "README.md", "gateway", "policies"}
    for stage in stages:
        for copy in stage.args_of("COPY"):
            if copy.startswith("--from="):
                continue
            *sources, _dest = copy.split()
            assert {s.rstrip("/").split("/")[0] for s in sources} <= allowed, copy
            for source in sources:
                assert (REPO_ROOT / source).exists(), source
