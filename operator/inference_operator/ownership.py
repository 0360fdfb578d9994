"""Who owns which field of a live object, read from its `metadata.managedFields`: pure.

Server-side apply removes a field the operator stops sending only if the operator's own
field manager owned it. Two kinds of foreign ownership defeat that:

- objects created by a plain POST (earlier versions of the operator) or hand edits
  (`kubectl set image`, `kubectl scale`, `kubectl edit`): another manager owns fields of the
  spec, so the operator's apply never removes or resets them;
- fields someone added that the operator never sets (`privileged: true`, an extra env var).

Both are drift. The repair is client-go's csaupgrade move: the foreign managers' spec fields
are folded into the operator's own Apply entry, so the next apply (which omits or overrides
them) removes or resets them. What others legitimately own is left alone: the status
subresource, metadata keys the operator does not set, the replica count when an HPA or KEDA
owns it, and `kubectl rollout restart`'s annotation.

A field set (`fieldsV1`) is a trie: keys such as `f:spec`, `k:{"name":"server"}` (a list-map
entry), `v:"x"` (a set value) and `.` (the node itself); leaves are empty dicts.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass

from .jsontypes import JsonObject
from .kinds import BY_KEY

FieldSet = dict[str, "FieldSet"]
Path = tuple[str, ...]

APPLY = "Apply"
RESTARTED_AT = "f:kubectl.kubernetes.io/restartedAt"


@dataclass(frozen=True)
class Drift:
    """Foreign spec fields found on a live object, and the ownership that repairs them."""

    managers: tuple[str, ...]
    managed_fields: list[JsonObject]

    def describe(self) -> str:
        return "fields changed by " + ", ".join(self.managers)


def merge(a: FieldSet, b: FieldSet) -> FieldSet:
    """The union of two field sets."""
    merged = copy.deepcopy(a)
    for key, sub in b.items():
        merged[key] = merge(merged.get(key, {}), sub)
    return merged


def split(fields: FieldSet, keep: Callable[[Path], bool], path: Path = ()) -> tuple[FieldSet, FieldSet]:
    """(kept, moved): the leaves of `fields` for which `keep(path)` holds at some prefix, and the rest."""
    kept: FieldSet = {}
    moved: FieldSet = {}
    for key, sub in fields.items():
        here = (*path, key)
        if keep(here):
            kept[key] = copy.deepcopy(sub)
        elif not sub:
            moved[key] = {}
        else:
            k, m = split(sub, keep, here)
            if k:
                kept[key] = k
            if m:
                moved[key] = m
    return kept, moved


def tolerated(desired: JsonObject, owner_uid: str) -> Callable[[Path], bool]:
    """The fields others may own on an object whose desired manifest is `desired`."""
    meta = desired.get("metadata") or {}
    ours: dict[Path, set[str]] = {
        ("f:metadata", "f:labels"): {f"f:{k}" for k in meta.get("labels") or {}},
        ("f:metadata", "f:annotations"): {f"f:{k}" for k in meta.get("annotations") or {}},
        ("f:metadata", "f:ownerReferences"): {"k:" + json.dumps({"uid": owner_uid}, separators=(",", ":"))},
    }
    kind = BY_KEY.get((desired.get("apiVersion", ""), desired.get("kind", "")))
    external_replicas = bool(kind and kind.keeps_live_replicas) and "replicas" not in (desired.get("spec") or {})

    def keep(path: Path) -> bool:
        top = path[0]
        if top in ("f:status", "f:apiVersion", "f:kind"):
            return True
        if top == "f:metadata":
            if len(path) < 3:
                return len(path) == 2 and path[1] not in {p[1] for p in ours}
            return path[2] not in ours.get(path[:2], set())
        if path == ("f:spec", "f:replicas"):
            return external_replicas
        return path[-1] == RESTARTED_AT and path[:4] == ("f:spec", "f:template", "f:metadata", "f:annotations")

    return keep


def _is_our_apply(entry: JsonObject, manager: str) -> bool:
    return bool(entry.get("manager") == manager and entry.get("operation") == APPLY and not entry.get("subresource"))


def _left_alone(entry: JsonObject) -> bool:
    """Entries drift never takes over: the status subresource's, and any not in FieldsV1."""
    return bool(entry.get("subresource") == "status" or entry.get("fieldsType", "FieldsV1") != "FieldsV1")


def drift(live: JsonObject, desired: JsonObject, owner_uid: str, manager: str) -> Drift | None:
    """Foreign ownership on `live` that the operator must take over, or None.

    Only foreign fields outside `metadata` count as drift; metadata keys the operator sets
    are taken over along with them, and their values are compared separately.
    """
    entries = (live.get("metadata") or {}).get("managedFields") or []
    keep = tolerated(desired, owner_uid)
    taken: FieldSet = {}
    managers: list[str] = []
    remaining: list[JsonObject] = []
    ours: JsonObject | None = None
    for entry in entries:
        if _is_our_apply(entry, manager):
            ours = entry
            continue
        if _left_alone(entry):
            remaining.append(entry)
            continue
        kept, moved = split(entry.get("fieldsV1") or {}, keep)
        if any(key != "f:metadata" for key in moved):
            managers.append(entry.get("manager", "unknown"))
        if moved:
            taken = merge(taken, moved)
        if kept:
            remaining.append({**entry, "fieldsV1": kept})
    if not managers:
        return None
    own = ours or {
        "manager": manager,
        "operation": APPLY,
        "apiVersion": live.get("apiVersion"),
        "fieldsType": "FieldsV1",
    }
    own = {**own, "fieldsV1": merge(own.get("fieldsV1") or {}, taken)}
    return Drift(tuple(sorted(set(managers))), [own, *remaining])


def metadata_differs(live: JsonObject, desired: JsonObject) -> bool:
    """Whether a label or annotation the operator sets has another value on `live`."""
    live_meta, want = live.get("metadata") or {}, desired.get("metadata") or {}
    for key in ("labels", "annotations"):
        have = live_meta.get(key) or {}
        if any(have.get(k) != v for k, v in (want.get(key) or {}).items()):
            return True
    return False


def foreign_spec_managers(live: JsonObject, manager: str) -> list[str]:
    """Managers other than the operator's Apply that own anything outside metadata and status.

    A cheap first look at an object from a watch event: when it finds none, the object has
    not drifted; when it finds some, `drift` decides with the desired manifest at hand.
    """
    found = []
    for entry in (live.get("metadata") or {}).get("managedFields") or []:
        if entry.get("subresource") == "status":
            continue
        if entry.get("manager") == manager and entry.get("operation") == APPLY:
            continue
        if any(key not in ("f:metadata", "f:status") for key in entry.get("fieldsV1") or {}):
            found.append(entry.get("manager", "unknown"))
    return sorted(set(found))
