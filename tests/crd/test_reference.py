"""docs/reference.md is generated from the CRD's schema (inference_operator/reference.py): fresh on
disk, and a row with its description for every field the CRD ships."""

from __future__ import annotations

import pathlib
import re

import pytest

from inference_operator import reference
from testsupport.crd import ROOT, crd_schema


def test_the_reference_page_is_fresh() -> None:
    assert not reference.is_stale(ROOT), "docs/reference.md is stale: run python -m inference_operator.reference"


def test_check_mode_names_a_stale_reference(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert reference.main(["--check", "--root", str(tmp_path)]) == 1
    assert reference.main(["--root", str(tmp_path)]) == 0
    assert reference.main(["--check", "--root", str(tmp_path)]) == 0
    page = tmp_path / reference.OUTPUT
    page.write_text(page.read_text().replace("| `maxBatchSize` |", "| `maxBatch` |"))
    assert reference.main(["--check", "--root", str(tmp_path)]) == 1
    assert str(page) in capsys.readouterr().err


def _schema_paths(node: dict, path: str) -> set[str]:
    paths = {path}
    for name, sub in node.get("properties", {}).items():
        paths |= _schema_paths(sub, f"{path}.{name}")
    items = node.get("items")
    if isinstance(items, dict) and "properties" in items:
        paths |= _schema_paths(items, path)
    return paths


def _reference_paths(text: str) -> set[str]:
    """Every field path the page has a row for: its section's path plus the row's name."""
    paths: set[str] = set()
    section = ""
    for line in text.splitlines():
        if heading := re.match(r"## (\S+) \{ #", line):
            section = heading[1]
            paths.add(section.removesuffix("[]"))
        elif (row := re.match(r"\| \[?`(\w+)`", line)) and section:
            paths.add(f"{section}.{row[1]}")
    return paths


def test_the_reference_has_a_row_for_every_field_of_the_crd() -> None:
    """The check the README's spec table had, on the generated page: every field of the CRD that
    ships (spec and status) is on it, with the description the CRD carries."""
    schema = crd_schema()["properties"]
    expected = _schema_paths(schema["spec"], "spec") | _schema_paths(schema["status"], "status")
    text = (ROOT / reference.OUTPUT).read_text()
    assert {p.replace("[]", "") for p in expected} == {p.replace("[]", "") for p in _reference_paths(text)}
    described = [
        sub["description"]
        for part in ("spec", "status")
        for section in [schema[part]]
        for sub in _descendants(section)
        if sub.get("description")
    ]
    missing = [d for d in described if " ".join(d.split()).replace("|", "\\|") not in text]
    assert described and missing == []


def _descendants(node: dict) -> list[dict]:
    found: list[dict] = []
    for sub in node.get("properties", {}).values():
        found += [sub, *_descendants(sub)]
    if isinstance(node.get("items"), dict):
        found += _descendants(node["items"])
    return found
