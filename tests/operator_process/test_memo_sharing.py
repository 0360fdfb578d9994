"""What the handlers of different objects share must be in the memo before kopf copies it.

kopf gives each object's handlers a shallow copy of the operator's memo (made when it first
sees the object). A service's reconcile runs with the InferenceService's copy, the mirror of its
Deployment with the Deployment's, each pod's event with that pod's: a lock or a record one of
them added to its own copy is that object's alone. The status lock was made that way once, and
a Deployment's news could be written over by a reconcile that had read the Deployment earlier:
the status said a replica was ready for 5 s after it had stopped being so.
"""

from __future__ import annotations

import ast
import pathlib

import kopf
from kopf._core.reactor.inventory import ResourceMemories

from inference_operator import config
from inference_operator.handlers import repair, shared, startup

HANDLERS = pathlib.Path(startup.__file__).parent
ISVC = {"apiVersion": "inference.rocm.dev/v1alpha1", "kind": "InferenceService"}
DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment"}
POD = {"apiVersion": "v1", "kind": "Pod"}


def _body(kind: dict[str, str], name: str, uid: str) -> kopf.RawBody:
    return {**kind, "metadata": {"namespace": "ml", "name": name, "uid": uid}}  # type: ignore[return-value]


async def test_every_objects_copy_of_the_memo_shares_the_status_locks_and_the_repair_record() -> None:
    memo = kopf.Memo(config=config.load(), api=object(), tracing=None)
    startup.configure(settings=kopf.OperatorSettings(), memo=memo)
    memories = ResourceMemories()
    copies = [
        await memories.recall_memo(_body(ISVC, "mlp", "u-isvc"), memobase=memo),
        await memories.recall_memo(_body(DEPLOYMENT, "mlp", "u-deployment"), memobase=memo),
        await memories.recall_memo(_body(POD, "mlp-abc", "u-pod"), memobase=memo),
    ]
    assert len({id(copy) for copy in copies}) == 3  # kopf's copies, one per object
    ref = shared.isvc_ref("ml", "mlp")
    assert len({id(shared.status_lock(copy, ref)) for copy in copies}) == 1
    assert len({id(repair._repair_times(copy, ("ml", "mlp"))) for copy in copies}) == 1
    copies[0].status_locks.forget("ml", "mlp")  # the service's deletion, seen from its own copy
    assert len(copies[1].status_locks) == 0


def test_no_handler_adds_to_its_own_copy_of_the_memo() -> None:
    """A standing check on the handlers' source: entries are added in `startup.configure` only.
    The one exception is per object by design: the daemons of one object share its `Lifetime`
    (lifetimes.py, outside this package), and they all run with that object's copy."""
    found = []
    for path in sorted(HANDLERS.glob("*.py")):
        if path.name == "startup.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            adds = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            adds = adds and node.func.attr == "setdefault" and _is_memo(node.func.value)
            targets = node.targets if isinstance(node, ast.Assign) else []
            sets = any(isinstance(t, ast.Attribute | ast.Subscript) and _is_memo(t.value) for t in targets)
            if adds or sets:
                found.append(f"{path.name}:{node.lineno}")
    assert not found, f"memo entries added outside startup.configure: {found}"


def _is_memo(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "memo"
