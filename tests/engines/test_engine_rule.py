"""Nothing outside `inference_operator.engines` names a particular engine: no `Engine.<member>`,
no engine's value, serving container, series or scaling-metric name as a literal; no module
named after an engine (a pod part of its own in the builders), no import of one engine's module,
no identifier that names one (a field per engine, `images.vllm`; a flag's or a variable's
constant, `VLLM_IMAGE_ENV`; a helper, `vllm_mounts`). What differs between engines is asked of
the engine object (traits, series, names, image, pod part), so adding one is its module and its
registry entry, and a change of an engine's series is one edit.

The scan reads the operator's sources as Python (the AST), not as text: docstrings and comments
may speak of vLLM; code may not choose by it.
"""

from __future__ import annotations

import ast
import re
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


def _words(name: str) -> tuple[str, ...]:
    """An identifier's or a name's words, lower case: `VLLM_IMAGE_ENV`, `modelServer` and
    `model-server` are (vllm, image, env), (model, server), (model, server)."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return tuple(word for word in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if word)


def engine_words() -> set[tuple[str, ...]]:
    """Each engine's name as words: its value's and its serving container's."""
    return {_words(name) for serving in ENGINES.values() for name in (serving.engine.value, serving.container)}


def _names_engine(name: str, engines: set[tuple[str, ...]]) -> bool:
    words = _words(name)
    return any(words[i : i + len(e)] == e for e in engines for i in range(len(words) - len(e) + 1))


def _identifiers(node: ast.AST) -> list[str]:
    """The names `node` binds or reads (not its strings: those are `engine_literals`' part)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.keyword) and node.arg:
        return [node.arg]
    if isinstance(node, ast.alias):
        return [node.name, node.asname or ""]
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    return []


def engine_identifiers_in(source: str, engines: set[tuple[str, ...]]) -> list[str]:
    """Where `source` chooses by an engine's name: an identifier (a module imported, a field, a
    constant, a function, an argument) one of whose words is an engine's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for name in _identifiers(node):
            if name and _names_engine(name, engines):
                found.append(f"line {getattr(node, 'lineno', '?')}: {name}")
    return found


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


def test_the_identifier_scan_finds_what_it_is_meant_to_find() -> None:
    engines = engine_words()
    source = (
        "from ..engines.vllm import VLLM\n"
        "from . import model_server\n"
        "image = owner.images.vllm\n"
        "VLLM_IMAGE_ENV = 'X'\n"
        "def model_server_container(modelServer): ...\n"
        "Images(vllm='v')\n"
    )
    assert sorted(engine_identifiers_in(source, engines)) == [
        "line 1: VLLM",
        "line 1: engines.vllm",
        "line 2: model_server",
        "line 3: vllm",
        "line 4: VLLM_IMAGE_ENV",
        "line 5: modelServer",
        "line 5: model_server_container",
        "line 6: vllm",
    ]
    neutral = "engine = engine_of(owner)\nserver = serving.pod(owner, shared)\nmodel = owner.model_name\n"
    assert engine_identifiers_in(neutral, engines) == []


OUTSIDE = sorted(p for p in PACKAGE.rglob("*.py") if ENGINES_DIR not in p.parents)


@pytest.mark.parametrize("path", OUTSIDE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_outside_the_engines_names_an_engine(path: Path) -> None:
    literals = engine_literals() - ALLOWED.get(str(path.relative_to(PACKAGE)), set())
    source = path.read_text(encoding="utf-8")
    assert engine_names_in(source, literals) == []
    # Nor chooses by one's name: its module, a field, a flag, a helper of its own.
    assert engine_identifiers_in(source, engine_words()) == []


def imported(path: Path, root: Path = PACKAGE) -> set[str]:
    """The modules `path` (of the package at `root`) imports, relative imports resolved, those
    under `if TYPE_CHECKING:` included."""
    package = ["inference_operator", *path.parent.relative_to(root).parts]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            parts = [*package[: len(package) - node.level + 1], *([node.module] if node.module else [])]
            base = ".".join(parts) if node.level else node.module or ""
            found |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
    return found


def test_the_import_scan_resolves_relative_and_type_checking_imports(tmp_path: Path) -> None:
    (tmp_path / "engines").mkdir()
    module = tmp_path / "engines" / "e.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..builders.common import Owner\n")
    assert "inference_operator.builders.common.Owner" in imported(module, tmp_path)
    module.write_text("from .. import models\nfrom .base import Engine\n")
    assert {"inference_operator.models", "inference_operator.engines.base"} <= imported(module, tmp_path)


@pytest.mark.parametrize("path", sorted(ENGINES_DIR.glob("*.py")), ids=lambda p: p.name)
def test_the_engines_import_neither_the_builders_nor_the_spec_model(path: Path) -> None:
    """The engines are the bottom of the pure core: the builders hand them values (`ServiceValues`,
    `SharedPod`). An import for the type checker alone escapes the import contracts, yet it ties
    an engine to the layers above it: the spec's types, the builders' Owner."""
    above = ("inference_operator.builders", "inference_operator.models")
    assert sorted(m for m in imported(path) if m.startswith(above)) == []


def test_no_module_outside_the_engines_is_named_after_an_engine() -> None:
    """An engine's pod part is its object's (`ServingEngine.pod`), not a builder of its own."""
    engines = engine_words()
    assert [str(p.relative_to(PACKAGE)) for p in OUTSIDE if _names_engine(p.stem, engines)] == []
