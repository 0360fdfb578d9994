"""No function of the shipped packages (the operator and the server's programs) is above
cyclomatic complexity 15, as radon counts it (each boolean operator a branch): past that a
function holds more than one decision and is split, as `repair.owned_event` was into repair
and mirror. The test support is held to the module size only."""

from __future__ import annotations

from radon.complexity import cc_visit

from tests.test_contributing_map import TESTSUPPORT, modules

LIMIT = 15


def test_no_function_is_above_the_limit() -> None:
    found = {
        f"{path}:{block.lineno} {block.fullname}": block.complexity
        for path in modules()
        if TESTSUPPORT not in path.parents
        for block in cc_visit(path.read_text())
        if block.complexity > LIMIT
    }
    assert found == {}


def test_the_count_is_radons_with_boolean_operators() -> None:
    """What the limit is held to: sixteen decisions, fifteen of them `and`s, count 17."""
    conditions = " and ".join(f"x{n}" for n in range(16))
    source = f"def f({', '.join(f'x{n}' for n in range(16))}):\n    if {conditions}:\n        return 1\n    return 0\n"
    (block,) = cc_visit(source)
    assert block.complexity == 17
