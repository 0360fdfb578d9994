"""bench/ and scripts/ run from the installed packages and testsupport: they import nothing from
tests (what they share with the tests lives in testsupport) and never edit sys.path."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PATH_EDITS = {"insert", "append", "extend", "remove", "clear", "pop"}


def _is_sys_path(node: ast.expr) -> bool:
    while isinstance(node, ast.Subscript):
        node = node.value
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def violations(source: str) -> list[tuple[int, str]]:
    """(line, what) for every import of `tests` and every change to `sys.path` in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] == "tests"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "tests":
            found.append((node.lineno, f"from {node.module} import"))
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            found += [(node.lineno, "sys.path assigned") for t in targets if _is_sys_path(t)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in PATH_EDITS
            and _is_sys_path(node.func.value)
        ):
            found.append((node.lineno, f"sys.path.{node.func.attr}"))
    return sorted(found)


def test_bench_and_scripts_import_no_tests_and_leave_sys_path_alone() -> None:
    files = sorted([*(ROOT / "bench").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")])
    assert files, "bench/ and scripts/ hold Python files"
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}" for path in files for line, what in violations(path.read_text())
    ]
    assert found == [], "move what is shared into testsupport/:\n" + "\n".join(found)


def test_the_check_finds_each_way_in() -> None:
    source = (
        "import sys\n"
        "sys.path.insert(0, '/repo')\n"
        "sys.path.append('x')\n"
        "sys.path[:0] = ['y']\n"
        "sys.path = ['z']\n"
        "sys.path += ['w']\n"
        "from tests.llm.conftest import running_vllm\n"
        "import tests.conftest\n"
        "from testsupport.vllm import running_vllm\n"  # testsupport is allowed
        "env = {'PYTHONPATH': ':'.join(sys.path)}\n"  # reading it is allowed
    )
    assert [line for line, _ in violations(source)] == [2, 3, 4, 5, 6, 7, 8]
