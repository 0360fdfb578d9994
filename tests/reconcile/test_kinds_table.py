"""Every apiVersion the operator writes comes from the kinds table: a literal anywhere else is a
second source of the same fact, and a version bump would miss it."""

from __future__ import annotations

import ast
import pathlib
import re

import inference_operator
from inference_operator import kinds

PACKAGE = pathlib.Path(inference_operator.__file__).parent
# "v1", "apps/v1", "keda.sh/v1alpha1", "inference.networking.x-k8s.io/v1alpha1", ...
API_VERSION = re.compile(r"^([a-z0-9]([a-z0-9.-]*[a-z0-9])?/)?v[0-9]+((alpha|beta)[0-9]+)?$")
# models/names.py names the custom resource's own version (VERSION), from which its table row is made.
OWN_VERSION = ("models/names.py", "VERSION")


def api_version_literals(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant in `source` (the package's `filename`) that reads as an
    apiVersion."""
    tree = ast.parse(source)
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and (filename, ast.unparse(node.targets[0])) == OWN_VERSION:
            allowed.add(id(node.value))
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and API_VERSION.match(node.value)
        and id(node) not in allowed
    )


def test_no_api_version_literal_outside_the_kinds_table() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{line}: {text!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "kinds.py" or path.parent != PACKAGE
        for line, text in api_version_literals(path.read_text(), path.relative_to(PACKAGE).as_posix())
    ]
    assert found == [], "apiVersion literals outside kinds.py (name the kind from kinds.py instead):\n" + "\n".join(
        found
    )


def test_the_check_finds_the_literals_it_forbids() -> None:
    source = (
        'DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment"}\n'
        'ref = Ref("v1", "Secret", "ns", "name")\n'
        'KEDA = "keda.sh/v1alpha1"\n'
        'VERSION = "v1beta1"\n'
        'text = "see apps/v1 for details"\n'
    )
    assert [text for _, text in api_version_literals(source, "builders.py")] == [
        "apps/v1",
        "v1",
        "keda.sh/v1alpha1",
        "v1beta1",
    ]
    # The one exemption is the custom resource's own version in models/names.py.
    assert api_version_literals('VERSION = "v1alpha1"\nOTHER = "v1"\n', "models/names.py") == [(2, "v1")]
    assert api_version_literals('VERSION = "v1alpha1"\n', "builders/names.py") == [(1, "v1alpha1")]


def test_every_table_api_version_reads_as_one() -> None:
    """The pattern the check uses matches every apiVersion the table holds, so none escapes it."""
    every = [*kinds.KINDS, kinds.CUSTOM_RESOURCE_DEFINITION, kinds.ENDPOINT_PICKER_CONFIG]
    assert [k.api_version for k in every if not API_VERSION.match(k.api_version)] == []


def test_a_header_and_a_version_come_from_the_row() -> None:
    assert kinds.DEPLOYMENT.header() == {"apiVersion": "apps/v1", "kind": "Deployment"}
    assert (kinds.POD.group, kinds.POD.version) == ("", "v1")
    assert (kinds.SCALED_OBJECT.group, kinds.SCALED_OBJECT.version) == ("keda.sh", "v1alpha1")


def test_the_custom_resource_is_addressed_through_its_row() -> None:
    """The InferenceService's own apiVersion is defined in models/ (the CRD is generated from it)
    and read elsewhere only through kinds.INFERENCE_SERVICE, like every other kind's."""
    found = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "models" and path.relative_to(PACKAGE).as_posix() != "kinds.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").split(".")[-1] == "models"
        and any(alias.name == "API_VERSION" for alias in node.names)
    ]
    assert found == [], "API_VERSION imported outside kinds.py (use kinds.INFERENCE_SERVICE):\n" + "\n".join(found)
