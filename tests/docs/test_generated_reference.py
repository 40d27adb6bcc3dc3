"""The generated reference pages (settings, CLI, error codes, metrics, audit fields) are what the
code generates now: a code, setting, flag, metric or audit field added without `make docs-ref`
fails here, and so does one the generator's tables do not describe."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_docs_ref.py"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs_ref", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_page_matches_what_the_code_generates() -> None:
    gen = generator()
    try:
        pages = gen.generated_pages()
    except gen.MissingDocumentation as exc:
        pytest.fail(f"{exc}\n(describe it in scripts/gen_docs_ref.py, then run `make docs-ref`)", pytrace=False)
    stale = [str(path.relative_to(ROOT)) for path, text in pages.items() if path.read_text(encoding="utf-8") != text]
    assert stale == [], f"{', '.join(stale)} differ from what the code generates: run `make docs-ref` and commit"


def test_a_code_the_tables_do_not_describe_stops_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = generator()
    monkeypatch.delitem(gen.ERROR_MEANINGS, "timeout")
    with pytest.raises(gen.MissingDocumentation, match="error code timeout is not described"):
        gen.render_error_codes()


def test_a_setting_documented_but_never_read_stops_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = generator()
    monkeypatch.setitem(gen.SETTINGS, "EGRESS_PROXY_LISTN", (None, "a typo"))
    with pytest.raises(gen.MissingDocumentation, match="EGRESS_PROXY_LISTN, which the code does not have"):
        gen.render_settings()


def test_every_metric_and_audit_field_of_the_code_is_on_its_page() -> None:
    gen = generator()
    metrics_page = (ROOT / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    assert all(f"`{name}`" in metrics_page for name, *_ in gen.metric_definitions())
    audit_page = (ROOT / "docs" / "reference" / "audit-log.md").read_text(encoding="utf-8")
    schema_fields = gen.json.loads(gen.AUDIT_SCHEMA.read_text(encoding="utf-8"))["properties"]
    assert all(f"`{name}`" in audit_page for name in schema_fields)
