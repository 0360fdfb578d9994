"""The project's extras as sets of distributions: what pyproject.toml names for an extra (its
references to the project's other extras followed), and everything an installed requirement pulls
in (from the installed distributions' own metadata, transitively). tests/test_packaging_extras.py
holds the demo to what it installs; tests/test_demo.py runs it with nothing else importable."""

from __future__ import annotations

import importlib.metadata
import pathlib
import tomllib
from functools import cache
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from testsupport.crd import ROOT

PROJECT = "rocm-inference-operator"
# What every venv has, whatever the project asks for.
VENV_TOOLS = frozenset({"pip", "setuptools", "wheel"})


@cache
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements(extra: str) -> list[Requirement]:
    """The third-party requirements `pip install '.[extra]'` asks for: the base dependencies and
    the extra's, references to the project's other extras followed."""
    project = pyproject()["project"]
    found: list[Requirement] = [Requirement(r) for r in project["dependencies"]]
    todo, seen = [extra], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for line in project["optional-dependencies"][name]:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == PROJECT:
                todo.extend(requirement.extras)
            else:
                found.append(requirement)
    return found


def names(found: list[Requirement]) -> set[str]:
    return {canonicalize_name(r.name) for r in found}


def installed_closure(found: list[Requirement]) -> set[str]:
    """The distributions `found` pulls in, as installed here: each one and its own requirements
    (with the extras asked of it), transitively."""
    closure: set[str] = set()
    todo = [(r.name, frozenset(r.extras)) for r in found if r.marker is None or r.marker.evaluate()]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), extras)
        if key in done:
            continue
        done.add(key)
        closure.add(key[0])
        for line in importlib.metadata.requires(name) or []:
            requirement = Requirement(line)
            wanted = requirement.marker is None or any(
                requirement.marker.evaluate({"extra": extra}) for extra in (extras or {""})
            )
            if wanted:
                todo.append((requirement.name, frozenset(requirement.extras)))
    return closure


def modules_outside(allowed: set[str]) -> set[str]:
    """Top-level modules installed here whose distributions are none of `allowed` (nor a venv's
    own tools): what a venv holding only `allowed` could not import."""
    keep = allowed | VENV_TOOLS | {PROJECT}
    return {
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if module.isidentifier() and not keep & {canonicalize_name(d) for d in dists}
    }


def blocking_path(directory: pathlib.Path, modules: set[str]) -> pathlib.Path:
    """A directory to put first on PYTHONPATH: `import m` of each of `modules` raises ImportError
    there, in the process and in every child that inherits the environment."""
    directory.mkdir(parents=True, exist_ok=True)
    for module in modules:
        (directory / f"{module}.py").write_text(f"raise ImportError('{module} is outside the demo extra')\n")
    return directory
