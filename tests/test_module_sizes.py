"""No module of the shipped packages or of testsupport grows past 800 lines: past that, a module
holds more than one concern and is split (as storage/, adapters/ and activator/ were)."""

from __future__ import annotations

from tests.test_contributing_map import modules

LIMIT = 800


def test_no_module_is_over_the_limit() -> None:
    sizes = {path: len(path.read_text().splitlines()) for path in modules()}
    assert sizes and {str(p): n for p, n in sizes.items() if n > LIMIT} == {}
