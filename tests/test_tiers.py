"""The real tiers are pytest markers (`pytest -m pods`, `pytest -m realapi`) while the xdist
scheduler, which sees node ids only, keys on the module's name (tests/tiers): the two must agree
for every module, or a tier's test would run on a second cluster, or a selected tier would miss
it. And each tier plugin skips what its marker selects, wherever the module lives."""

from __future__ import annotations

import ast
import pathlib
from types import SimpleNamespace
from typing import Any

import pytest

from tests import tiers
from tests.tiers import pods, realapi

ROOT = pathlib.Path(__file__).resolve().parents[1]


def declared_tiers(source: str) -> set[str]:
    """The tier markers a module's `pytestmark` names (`pytest.mark.<tier>`)."""
    found = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            for part in ast.walk(node.value):
                if isinstance(part, ast.Attribute) and part.attr in tiers.SUFFIXES:
                    found.add(part.attr)
    return found


def test_every_module_of_a_tier_is_named_and_marked_alike() -> None:
    modules = sorted((ROOT / "tests").rglob("test_*.py"))
    wrong = {
        str(path.relative_to(ROOT)): (sorted(declared_tiers(path.read_text())), tiers.tier_of(path.name))
        for path in modules
        if declared_tiers(path.read_text()) != ({tiers.tier_of(path.name)} - {None})
    }
    assert wrong == {}, "(marked, named) disagree; a tier's module is *_pods.py or *_realapi.py with its marker"
    # Both tiers have modules, in more than one feature folder: the tiers are not folders.
    for tier in tiers.SUFFIXES:
        folders = {path.parent for path in modules if tiers.tier_of(path.name) == tier}
        assert len(folders) > 1, (tier, folders)


def test_a_marker_without_its_name_or_a_name_without_its_marker_is_found() -> None:
    assert declared_tiers("import pytest\npytestmark = [pytest.mark.pods, pytest.mark.slow]\n") == {"pods"}
    assert declared_tiers("import pytest\npytestmark = pytest.mark.realapi\n") == {"realapi"}
    assert declared_tiers("import pytest\npytestmark = [pytest.mark.slow]\nx = pytest.mark.pods\n") == set()
    assert tiers.tier_of("tests/llm/test_vllm_pods.py::test_a") == "pods"
    assert tiers.tier_of("tests/llm/test_vllm_builders.py::test_pods") is None


class Item(SimpleNamespace):
    def __init__(self, *markers: str) -> None:
        super().__init__(markers=set(markers), added=[])

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.markers else None

    def add_marker(self, marker: Any) -> None:
        self.added.append(marker)


@pytest.mark.parametrize(
    ("plugin", "tier", "unavailable"),
    [
        (pods, "pods", ("nodecluster.missing", lambda: "no kubelet")),
        (realapi, "realapi", ("assets", lambda: None)),
    ],
)
def test_a_tier_plugin_skips_what_its_marker_selects_and_nothing_else(
    plugin: Any, tier: str, unavailable: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, answer = unavailable
    owner: Any = plugin.nodecluster if name.startswith("nodecluster.") else plugin
    monkeypatch.setattr(owner, name.rsplit(".", 1)[-1], answer)
    marked, other, fast = Item(tier, "slow"), Item(*(set(tiers.SUFFIXES) - {tier})), Item("slow")
    plugin.pytest_collection_modifyitems([marked, other, fast])
    assert [m.mark.name for m in marked.added] == ["skip"]
    assert other.added == [] and fast.added == []


def plugin_fixtures(plugin: Any) -> set[str]:
    """The fixtures a plugin defines (pytest's fixture definitions among its names)."""
    return {name for name, value in vars(plugin).items() if type(value).__name__ == "FixtureFunctionDefinition"}


def test_no_module_binds_a_tier_fixture_of_its_own() -> None:
    """A plugin's fixture bound in a module (imported, or taken as an attribute) is a definition
    of that module's own: a session fixture then runs once per module (an operator process each,
    all at once on the tier's one API server, fighting over the same objects)."""
    fixtures = {plugin.__name__.rsplit(".", 1)[-1]: plugin_fixtures(plugin) for plugin in (pods, realapi)}
    assert {"node", "project_images"} <= fixtures["pods"] and {"apiserver", "realapi_operator"} <= fixtures["realapi"]
    bound = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests.tiers."):
                tier = (node.module or "").rsplit(".", 1)[-1]
                bound += [(path.name, a.name) for a in node.names if a.name in fixtures.get(tier, set())]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in fixtures:
                bound += [(path.name, node.attr)] if node.attr in fixtures[node.value.id] else []
    assert bound == []
