"""The suite's two real tiers, each a pytest marker and a module-name suffix that agree
(tests/test_tiers.py): the real-pods tier (`pytest -m pods`, modules `*_pods.py`, a real
single-node cluster) and the real-API-server tier (`pytest -m realapi`, modules `*_realapi.py`,
a real kube-apiserver). A tier's modules live in the feature folders beside that feature's
emulator tests; the marker is what a person selects by, and the suffix is what the xdist
scheduler keys on (it sees node ids, not markers). Their fixtures are the plugins
`tests.tiers.pods` and `tests.tiers.realapi`, loaded by tests/conftest.py."""

from __future__ import annotations

# Tier marker -> the ending of its modules' file names.
SUFFIXES = {"pods": "_pods.py", "realapi": "_realapi.py"}
# The longest tier, which runs first on a worker of its own while the others share the rest.
FIRST = "pods"


def tier_of(nodeid: str) -> str | None:
    """The tier of a test (a node id or a module's path), by its module's file name."""
    module = nodeid.split("::", 1)[0]
    return next((tier for tier, suffix in SUFFIXES.items() if module.endswith(suffix)), None)
