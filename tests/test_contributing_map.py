"""CONTRIBUTING.md's map names every module of the shipped packages (the operator and each of
the server's programs) and of testsupport, so a newcomer finds each one there (and a new module
is not done until it is placed on the map)."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
SERVER = ("model_server", "bounded_http", "inference_activator", "vllm_front", "adapters_sidecar", "model_fetcher")
OPERATOR, TESTSUPPORT = ROOT / "operator" / "inference_operator", ROOT / "testsupport"
PACKAGES = [OPERATOR, *(ROOT / "server" / name for name in SERVER), TESTSUPPORT]
GENERATED = re.compile(r"_pb2\.pyi?$")


def modules() -> list[pathlib.Path]:
    return [
        path
        for package in PACKAGES
        for path in sorted(package.rglob("*.py"))
        if path.name != "__init__.py" and "__pycache__" not in path.parts and not GENERATED.search(path.name)
    ]


def named(path: pathlib.Path, package: pathlib.Path, text: str) -> bool:
    """Named by its path in the package (`prometheus/promql.py`) or by its file name alone, in a
    list of names or under its directory's entry (`storage/ ... cli.py`)."""
    relative = path.relative_to(package).as_posix()
    return relative in text or re.search(r"(?<![\w./-])" + re.escape(path.name) + r"(?![\w])", text) is not None


def test_the_map_names_every_module() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    missing = [
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in modules()
        if path.is_relative_to(package) and not named(path, package, text)
    ]
    assert modules() and missing == [], f"not on CONTRIBUTING.md's map: {missing}"


def test_a_module_left_off_the_map_is_found() -> None:
    package = PACKAGES[0]
    assert named(package / "prometheus" / "promql.py", package, "  prometheus/promql.py   queries")
    assert named(package / "builders" / "hpa.py", package, "    service.py, hpa.py, keda.py")
    assert not named(package / "builders" / "hpa.py", package, "    service.py, keda.py  an hpa.pyc file")
