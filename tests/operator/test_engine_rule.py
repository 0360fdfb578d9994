"""Nothing outside `inference_operator.engines` names a particular engine: no `Engine.<member>`,
no engine's value, serving container, series or scaling-metric name as a literal. What differs
between engines is asked of the engine object (traits, series, names), so adding one is its
module and its registry entry, and a change of an engine's series is one edit.

The scan reads the operator's sources as Python (the AST), not as text: docstrings and comments
may speak of vLLM; code may not choose by it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import inference_operator
from inference_operator.engines import ENGINES
from inference_operator.engines.base import Engine, GpuGauge, PodGauge, PodRate, Quantile, ServingEngine

PACKAGE = Path(inference_operator.__file__).parent
ENGINES_DIR = PACKAGE / "engines"
# Literals that name something else that happens to share an engine's word: every pod's
# `app.kubernetes.io/name` is the product's name, whatever the engine.
ALLOWED = {"builders/common.py": {"model-server"}}


def _source_names(serving: ServingEngine) -> set[str]:
    names: set[str] = set()
    for source in serving.series.metrics.values():
        if isinstance(source, Quantile):
            names.add(source.histogram)
        elif isinstance(source, PodGauge):
            names.add(source.gauge)
        elif isinstance(source, PodRate):
            names.add(source.counter)
        elif isinstance(source, GpuGauge):
            names |= {source.gauge, *source.on}
    return names


def engine_literals() -> set[str]:
    """Every string that names one engine: its value, its container, its series, its HPA names."""
    literals: set[str] = set()
    for engine, serving in ENGINES.items():
        series = serving.series
        literals |= {engine.value, serving.container, series.request_latency, series.answered}
        literals |= {*series.holding, *series.scraped, *_source_names(serving)}
        literals |= {name.name for name in serving.scaling_names.values()}
    return literals


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the constants that are docstrings (prose may name an engine)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def engine_names_in(source: str, literals: set[str]) -> list[str]:
    """Where `source` names a particular engine: `Engine.MEMBER`, or a literal of `literals`."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Engine":
            if node.attr in Engine.__members__:
                found.append(f"line {node.lineno}: Engine.{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value in literals:
                found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_the_scan_finds_what_it_is_meant_to_find() -> None:
    literals = engine_literals()
    source = 'engine = Engine.VLLM\nname = "vllm:num_requests_waiting"\n'
    assert engine_names_in(source, literals) == ["line 1: Engine.VLLM", "line 2: 'vllm:num_requests_waiting'"]
    prose = '"""vLLM serves vllm:num_requests_waiting."""\n# Engine.VLLM\nx = ENGINES[spec.runtime.engine]\n'
    assert engine_names_in(prose, literals) == []


@pytest.mark.parametrize(
    "path",
    sorted(p for p in PACKAGE.rglob("*.py") if ENGINES_DIR not in p.parents),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_no_module_outside_the_engines_names_an_engine(path: Path) -> None:
    literals = engine_literals() - ALLOWED.get(str(path.relative_to(PACKAGE)), set())
    assert engine_names_in(path.read_text(encoding="utf-8"), literals) == []
