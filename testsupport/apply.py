"""Field ownership as the API server keeps it (`metadata.managedFields`), for the emulator.

A real API server records, per field manager and operation, the set of fields that manager
set, in `metadata.managedFields` (format FieldsV1: `f:<field>`, `k:<list-map key as JSON>`,
`v:<set value as JSON>`, `.` for a list element itself). The rules modelled here:

- **Apply** (PATCH `application/apply-patch+yaml`, `fieldManager` required): the manager's
  applied set is REPLACED by the fields of this request. A field it applied before and omits
  now is removed from the object, unless another manager (any operation) still owns it; a
  list element goes only when nobody else owns anything inside it. An apply to a missing
  object creates it. A field another manager owns with a different value is a conflict (409)
  unless `force=true`, which takes it over; with the same value both own it.
- **Update** (POST, merge/JSON/strategic-merge PATCH, PUT): the manager (`fieldManager`, or
  the User-Agent's product name as the real server derives it) gains every field whose value
  this request changed or added; other managers lose those fields; removed fields leave every
  set. So an object created by POST is owned by the creator's manager with operation Update,
  and a later apply by another manager never removes those fields — the leftover behaviour of
  a real cluster. A request that itself rewrites `metadata.managedFields` (as client-go's
  csaupgrade does with a JSON patch) has its list taken as the new ownership.
- **List types** of the built-in kinds the project writes: list-maps merged by key
  (containers/initContainers by `name`, container ports by `containerPort`+`protocol`, Service
  ports by `port`+`protocol`, env, volumes, imagePullSecrets by `name`, volumeMounts by
  `mountPath`, conditions by `type`, ownerReferences by `uid`, topologySpreadConstraints,
  hostAliases, resource claims), `finalizers` a set, every other list atomic (tolerations,
  args, command, nodeSelectorTerms...), and label selectors / `nodeSelector` atomic maps.
  Lists of custom resources are atomic (no `x-kubernetes-list-type` is read).

Simplified: no defaulting and no conversion (one version per kind); the ownership of
`status` and `scale` writes is recorded with the subresource but conflicts are not checked
across subresources; the order of a merged list-map is the live order with new entries
appended; containers left empty by a removal are dropped.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from inference_operator.jsontypes import JsonObject

Path = tuple[str, ...]  # FieldsV1 keys from the root: ("f:spec", "f:template", ..., 'k:{"name":"server"}')

# A list element's own node (FieldsV1 ".") has no value of its own to compare.
ELEMENT = object()
_MISSING = object()

LIST_MAP_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "volumeDevices": ("devicePath",),
    "imagePullSecrets": ("name",),
    "hostAliases": ("ip",),
    "resourceClaims": ("name",),
    "claims": ("name",),
    "schedulingGates": ("name",),
    "readinessGates": ("conditionType",),
    "topologySpreadConstraints": ("topologyKey", "whenUnsatisfiable"),
    "conditions": ("type",),
    "ownerReferences": ("uid",),
}
KEY_DEFAULTS = {"protocol": "TCP"}
SET_LISTS = {"finalizers"}
ATOMIC_MAPS = {"selector", "labelSelector", "namespaceSelector", "nodeSelector"}
CONTAINER_LISTS = {"containers", "initContainers", "ephemeralContainers"}
# Strategic merge patch keys differ for ports: one field each.
SMP_KEYS = {"container ports": ("containerPort",), "service ports": ("port",)}
METADATA_FIELDS = ("labels", "annotations", "ownerReferences", "finalizers")


class ApplyConflict(Exception):
    """Fields another manager owns with another value; `conflicts` = [(manager, path)]."""

    def __init__(self, conflicts: list[tuple[str, Path]]):
        self.conflicts = conflicts
        described = "; ".join(f'conflict with "{m}": {dotted(p)}' for m, p in conflicts)
        super().__init__(f"Apply failed with {len(conflicts)} conflict(s): {described}")


@dataclass(frozen=True)
class Kind:
    """What decides list and map types: the resource's kind and whether it is built in."""

    kind: str
    builtin: bool


def dotted(path: Path) -> str:
    return ".".join(p[2:] if p.startswith("f:") else p[1:] if p.startswith("k:") else p for p in path)


def list_keys(kind: Kind, names: tuple[str, ...], strategic: bool = False) -> tuple[str, ...] | None:
    """The key fields of the list at `names` when it is a list-map, else None."""
    last = names[-1]
    if not kind.builtin and names[0] != "metadata":
        return None
    if last == "ports":
        if any(n in CONTAINER_LISTS for n in names):
            return SMP_KEYS["container ports"] if strategic else ("containerPort", "protocol")
        if kind.kind == "Service" and names == ("spec", "ports"):
            return SMP_KEYS["service ports"] if strategic else ("port", "protocol")
        return None
    return LIST_MAP_KEYS.get(last)


def _is_set(kind: Kind, names: tuple[str, ...]) -> bool:
    return names[-1] in SET_LISTS and (kind.builtin or names[0] == "metadata")


def _atomic_map(kind: Kind, names: tuple[str, ...]) -> bool:
    return kind.builtin and names[-1] in ATOMIC_MAPS


def element_key(item: JsonObject, keys: tuple[str, ...]) -> str:
    key = {k: item.get(k, KEY_DEFAULTS.get(k)) for k in keys}
    return "k:" + json.dumps(key, sort_keys=True, separators=(",", ":"))


def flatten(obj: JsonObject | None, kind: Kind) -> dict[Path, Any]:
    """Every owned-able field of `obj` (leaves and list elements) → its value."""
    out: dict[Path, Any] = {}
    if not obj:
        return out
    for top, value in obj.items():
        if top in ("apiVersion", "kind"):
            continue
        if top == "metadata":
            for name in METADATA_FIELDS:
                if isinstance(value, dict) and name in value:
                    _walk(value[name], kind, ("metadata", name), ("f:metadata", f"f:{name}"), out)
            continue
        _walk(value, kind, (top,), (f"f:{top}",), out)
    return out


def _walk(value: Any, kind: Kind, names: tuple[str, ...], path: Path, out: dict[Path, Any]) -> None:
    if isinstance(value, dict) and not _atomic_map(kind, names):
        if not value:
            out[path] = {}
        for key, item in value.items():
            _walk(item, kind, (*names, key), (*path, f"f:{key}"), out)
    elif isinstance(value, list) and (keys := list_keys(kind, names)) and all(isinstance(i, dict) for i in value):
        for item in value:
            element = (*path, element_key(item, keys))
            out[element] = ELEMENT
            for key, sub in item.items():
                _walk(sub, kind, (*names, key), (*element, f"f:{key}"), out)
    elif isinstance(value, list) and _is_set(kind, names):
        for item in value:
            out[(*path, "v:" + json.dumps(item, separators=(",", ":")))] = item
    else:
        out[path] = value


def to_fields_v1(paths: Iterable[Path]) -> JsonObject:
    """A set of paths as the nested FieldsV1 document."""
    tree: JsonObject = {}
    members: list[JsonObject] = []
    for path in paths:
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        members.append(node)
    for node in members:
        if node:
            node["."] = {}
    return tree


def from_fields_v1(tree: JsonObject, prefix: Path = ()) -> set[Path]:
    paths: set[Path] = set()
    for key, sub in tree.items():
        if key == ".":
            paths.add(prefix)
        elif not sub:
            paths.add((*prefix, key))
        else:
            paths |= from_fields_v1(sub, (*prefix, key))
    return paths


@dataclass
class Entry:
    """One managedFields entry, with its fields decoded."""

    manager: str
    operation: str
    api_version: str
    subresource: str = ""
    fields: set[Path] = field(default_factory=set)
    time: str = ""

    def key(self) -> tuple[str, str, str]:
        return (self.manager, self.operation, self.subresource)

    def encode(self) -> JsonObject:
        entry = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(sorted(self.fields)),
        }
        if self.subresource:
            entry["subresource"] = self.subresource
        return entry


def decode(managed: Any) -> list[Entry]:
    entries = []
    for raw in managed or []:
        if not isinstance(raw, dict) or not raw.get("manager"):
            continue  # `[{}]` resets ownership, as on the real server
        entries.append(
            Entry(
                manager=raw["manager"],
                operation=raw.get("operation", "Update"),
                api_version=raw.get("apiVersion", ""),
                subresource=raw.get("subresource", ""),
                fields=from_fields_v1(raw.get("fieldsV1") or {}),
                time=raw.get("time", ""),
            )
        )
    return entries


def encode(entries: list[Entry]) -> list[JsonObject]:
    return [e.encode() for e in entries if e.fields]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _entry(entries: list[Entry], manager: str, operation: str, api_version: str, subresource: str) -> Entry:
    for entry in entries:
        if entry.key() == (manager, operation, subresource):
            return entry
    entry = Entry(manager, operation, api_version, subresource)
    entries.append(entry)
    return entry


def apply(
    live: JsonObject | None, applied: JsonObject, manager: str, kind: Kind, force: bool, api_version: str
) -> tuple[JsonObject, list[Entry]]:
    """The object after `manager` applies `applied` to `live` (None: create), and the new ownership.

    `live` is not modified. Raises ApplyConflict when another manager owns a field this apply
    sets to another value and `force` is false.
    """
    entries = decode((live or {}).get("metadata", {}).get("managedFields"))
    mine = _entry(entries, manager, "Apply", api_version, "")
    applied_fields = flatten(applied, kind)
    _take_over(entries, mine, applied_fields, flatten(live, kind), force)
    kept = _prefixes(path for e in entries if e is not mine for path in e.fields)
    result = _without_managed_fields(live)
    protected = kept | _prefixes(applied_fields)
    for path in sorted(_dropped(mine.fields - applied_fields.keys(), kept), key=len, reverse=True):
        _remove(result, path, kind, protected)
    merge(result, _clone(applied), kind)
    mine.fields = set(applied_fields)
    mine.api_version = api_version
    mine.time = now()
    return result, [e for e in entries if e.fields]


def _take_over(
    entries: list[Entry], mine: Entry, applied_fields: dict[Path, Any], live_fields: dict[Path, Any], force: bool
) -> None:
    """Conflicts: fields this apply sets to a new value that other managers own. Without `force`
    they fail the apply; with it, they pass to `mine` (the others lose them)."""
    conflicts = [
        (entry, path)
        for path, value in applied_fields.items()
        if live_fields.get(path, value) != value
        for entry in entries
        if entry is not mine and path in entry.fields
    ]
    if conflicts and not force:
        raise ApplyConflict([(entry.manager, path) for entry, path in conflicts])
    for entry, path in conflicts:
        entry.fields.discard(path)


def _prefixes(paths: Iterable[Path]) -> set[Path]:
    """Every path and each of its ancestors (but the root)."""
    return {path[:i] for path in paths for i in range(1, len(path) + 1)}


def _dropped(unapplied: set[Path], kept: set[Path]) -> set[Path]:
    """The fields a manager applied before and omits now that nobody else keeps.

    A dropped element goes whole (nobody else owns anything in it): its fields need no visit,
    and could not be found once its key fields were gone.
    """
    dropped = {path for path in unapplied if path not in kept}
    return {path for path in dropped if not any(path[:i] in dropped for i in range(1, len(path)))}


def _without_managed_fields(live: JsonObject | None) -> JsonObject:
    """A copy of `live` (empty for a create) without its managedFields, which apply rewrites."""
    if not live:
        return {}
    result: JsonObject = _clone({k: v for k, v in live.items() if k != "metadata"})
    result["metadata"] = _clone({k: v for k, v in (live.get("metadata") or {}).items() if k != "managedFields"})
    return result


def _clone(value: Any) -> Any:
    """A deep copy of a JSON document (several times faster than copy.deepcopy)."""
    return json.loads(json.dumps(value))


def record_update(
    old: JsonObject | None,
    new: JsonObject,
    entries: list[Entry],
    manager: str,
    kind: Kind,
    subresource: str,
    api_version: str,
) -> list[Entry]:
    """Ownership after a non-apply write by `manager` turned `old` into `new`."""
    old_fields = flatten(old, kind)
    new_fields = flatten(new, kind)
    changed = {path for path, value in new_fields.items() if old_fields.get(path, _MISSING) != value}
    gone = old_fields.keys() - new_fields.keys()
    if not changed and not gone:
        return entries
    for entry in entries:
        entry.fields -= changed
        entry.fields -= gone
    if changed:
        mine = _entry(entries, manager, "Update", api_version, subresource)
        mine.fields |= changed
        mine.time = now()
    return [e for e in entries if e.fields]


def _remove(obj: JsonObject, path: Path, kind: Kind, protected: set[Path]) -> None:
    """Delete the field or list element at `path`, then containers it leaves empty (unless owned)."""
    trail: list[tuple[Any, Any]] = []  # (container, key or index) from the root
    node: Any = obj
    names: tuple[str, ...] = ()
    for part in path:
        if part.startswith("f:"):
            if not isinstance(node, dict) or part[2:] not in node:
                return
            trail.append((node, part[2:]))
            names = (*names, part[2:])
            node = node[part[2:]]
        elif part.startswith(("k:", "v:")) and isinstance(node, list):
            keys = list_keys(kind, names)
            if part.startswith("k:"):
                index = next((i for i, item in enumerate(node) if keys and element_key(item, keys) == part), None)
            else:
                wanted = json.loads(part[2:])
                index = next((i for i, item in enumerate(node) if item == wanted), None)
            if index is None:
                return
            trail.append((node, index))
            node = node[index]
        else:
            return
    for depth in range(len(trail) - 1, -1, -1):
        container, key = trail[depth]
        if depth < len(trail) - 1 and (container[key] or path[: depth + 1] in protected):
            break
        del container[key]


def merge(
    live: JsonObject, applied: JsonObject, kind: Kind, names: tuple[str, ...] = (), strategic: bool = False
) -> JsonObject:
    """Merge `applied` into `live` in place: maps by key, list-maps by element key, the rest replaced.

    With `strategic`, as a strategic merge patch: null deletes a key, `$patch: delete` an element.
    """
    for key, value in applied.items():
        here = (*names, key)
        if strategic and key.startswith("$"):
            continue
        if strategic and value is None:
            live.pop(key, None)
            continue
        current = live.get(key)
        if isinstance(value, dict) and isinstance(current, dict) and not _atomic_map(kind, here):
            merge(current, value, kind, here, strategic)
        elif isinstance(value, list) and isinstance(current, list) and (keys := list_keys(kind, here, strategic)):
            _merge_list(current, value, keys, kind, here, strategic)
        elif isinstance(value, list) and isinstance(current, list) and _is_set(kind, here):
            current.extend(item for item in value if item not in current)
        elif strategic and isinstance(value, dict):
            live[key] = merge({}, value, kind, here, strategic)
        else:
            live[key] = value
    return live


def _merge_list(
    current: list[Any], applied: list[Any], keys: tuple[str, ...], kind: Kind, names: tuple[str, ...], strategic: bool
) -> None:
    index = {element_key(item, keys): i for i, item in enumerate(current) if isinstance(item, dict)}
    deleted: set[int] = set()
    for item in applied:
        if not isinstance(item, dict):
            current.append(item)
            continue
        position = index.get(element_key(item, keys))
        if strategic and item.get("$patch") == "delete":
            if position is not None:
                deleted.add(position)
            continue
        if position is None:
            current.append(merge({}, item, kind, names, strategic) if strategic else item)
            index[element_key(item, keys)] = len(current) - 1
        else:
            merge(current[position], item, kind, names, strategic)
    if deleted:
        current[:] = [item for i, item in enumerate(current) if i not in deleted]
