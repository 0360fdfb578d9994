"""A Kubernetes API emulator for integration tests: kmock's, plus what a real API server does.

kmock's `KubernetesEmulator` stores objects and serves list/watch/get/create/patch/delete, but
keeps objects as plain merged JSON. Real API servers do more, the operator depends on it, and
an emulator that does less hides the operator's bugs. This one adds:

- `metadata.uid`, `creationTimestamp`, `resourceVersion` (new only when a write changes
  something: a no-op patch stores nothing and sends no watch event), `generation` (bumped when
  anything but metadata and status changes), `generateName`, and optimistic concurrency (a
  write naming a stale resourceVersion gets 409);
- the status subresource: a write to the object ignores `status`, a write to `/status` only
  changes `status`; the scale subresource writes `spec.replicas`;
- server-side apply with field ownership in `metadata.managedFields` (testsupport/apply.py):
  an apply replaces its manager's field set, so fields it stops applying go unless another
  manager owns them; list-maps (containers, ports, env, volumes...) merge by key; an apply
  creates a missing object; an object created by POST or changed by a merge patch is owned by
  that client's manager (operation Update), whose fields a later apply does not remove. Strategic
  merge patches merge list-maps by key too; PUT replaces;
- `dryRun=All` on create, patch, apply and delete: validated and answered, never stored,
  counted in `dry_runs` instead of `writes`;
- validation with the API server's 422 (testsupport/objectrules.py): object names (DNS-1035
  labels for Services, DNS-1123 subdomains for most kinds), label keys and values, duplicate
  container names, port names and Service ports; InferenceServices get the API server's whole
  verdict from `validate_custom_resource` (unknown fields, defaults, schema, CEL rules) on every
  create and on every update that changes the spec (unchanged specs are not judged again, like
  validation ratcheting), and are stored with the schema's defaults filled.

- lists honour an equality-based `labelSelector` (`k=v,k2=v2`), as the API server does; kmock
  returns every object of the resource;
- Service cluster IPs: every Service but a headless one takes an address from a range of
  `service_ip_range` addresses (the API server's `--service-cluster-ip-range`; 65,534 as a /16)
  and frees it when deleted; with the range full, creating one (dry runs too) answers the real
  server's 500 "failed to allocate a serviceIP ...: range is full". The address itself is not
  written into the object.

It also counts write requests per resource and verb (`writes`), which the tests use to prove
that a resync writes nothing.

Request handling costs O(1) in the length of the request history (`HistoryFreeDispatch`).
kmock keeps every request for assertions, and decides which reaction answers a request by
asking each reaction's view whether it contains the request — which replays the whole history
through the view's filters, for every reaction, on every request. With ~20 reactions (the
emulator's own fallbacks) a run of 50 InferenceServices took 26 s and 200 took 358 s. Here a
request is matched against the view chain directly: a filter checks its criteria on this one
request, a slice keeps a running count of the requests its source has seen (counted once from
history when first met, then incremented), groups and exclusions combine their parts; only a
view kind this module does not know falls back to kmock's history replay. The history itself
is still kept, so `len(view)` and assertions on requests work as before. Reads, patches and
deletes find their object by key instead of scanning every stored object.
"""

from __future__ import annotations

import collections
import copy
import json
import uuid
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
import yaml
from kmock._internal import dicts
from kmock._internal.rendering import ReactionMismatchError

from inference_operator.jsontypes import JsonObject
from inference_operator.validation import default_custom_resource, validate_custom_resource
from testsupport import apply, objectrules

# The key of a stored object: (resource, namespace, name).
Key = tuple[kmock.resource, str | None, str]

CR_RESOURCE = "inference.rocm.dev/v1alpha1/inferenceservices"


class HistoryFreeDispatch(kmock.RawHandler):
    """kmock's request → reaction matching, with the cost independent of the request history.

    Placed between kmock's KubernetesEmulator and RawHandler in the MRO, so the emulator's
    storage runs as before and only the matching step is replaced. Same answers as kmock's
    `request in reaction._source`: see the module docstring for how each view kind is decided.
    The concrete (attrs, slotted) class provides the state: `_slice_counts` (id of a slice
    view → (view, requests its source has seen)) and `_order_cache` (payload ids, their order).
    """

    _slice_counts: dict[int, tuple[kmock.View, int]]
    _order_cache: tuple[tuple[int, ...], list[kmock.Reaction], list[kmock.Reaction]]

    __slots__ = ()

    async def _handle(self, request: kmock.Request) -> Any:
        seen: dict[int, bool] = {}
        payloads: list[kmock.Reaction] = list(self._payloads)
        ordered, counting = self._ordered(payloads)
        # Every slice must count every request its source sees, whichever reaction answers it;
        # other views are judged lazily, in priority order, until one answers (as in kmock).
        for payload in counting:
            self._sees(payload._source, request, seen)
        for payload in ordered:
            if self._sees(payload._source, request, seen) and not payload._disabled.is_set():
                try:
                    return await payload(request)
                except ReactionMismatchError:  # mismatch or depletion, as in kmock
                    payload._disabled.set()
                except NotImplementedError:  # matched, nothing to respond with
                    pass
        raise NotImplementedError("no reaction matches the request; add a fallback: `kmock.fallback << 404`")

    def _ordered(self, payloads: list[kmock.Reaction]) -> tuple[list[kmock.Reaction], list[kmock.Reaction]]:
        """kmock's priority order (higher first, zero-padded tuples, stable), and the payloads
        whose views hold a slice; cached per payload set."""
        ids = tuple(map(id, payloads))
        if self._order_cache[0] == ids:
            return self._order_cache[1], self._order_cache[2]
        priorities = [tuple(-p for p in payload.priorities) for payload in payloads]
        width = max((len(p) for p in priorities), default=0)
        padded = [p + (0,) * (width - len(p)) for p in priorities]
        order = sorted(range(len(payloads)), key=lambda i: padded[i])
        result = [payloads[i] for i in order]
        counting = [p for p in payloads if any(True for _ in p._source._walk(kmock.Slicer))]
        # A slot of the concrete (attrs) class, which mypy cannot see from this mixin.
        self._order_cache = (ids, result, counting)  # type: ignore[misc]
        return result, counting

    def _sees(self, view: kmock.View, request: kmock.Request, seen: dict[int, bool]) -> bool:
        """Whether `request` (the newest in history) is among the requests `view` yields."""
        key = id(view)
        if key in seen:
            return seen[key]
        result: bool
        if isinstance(view, kmock.Root):
            result = view is self
        elif type(view) is kmock.Filter:
            result = self._sees(view._source, request, seen) and _may_match(view.criteria, request)
            result = result and bool(view.criteria(request))
        elif type(view) is kmock.Priority:
            result = self._sees(view._source, request, seen)
        elif type(view) is kmock.Slicer:
            inner = self._sees(view._source, request, seen)
            counted = self._slice_counts.get(key)
            if counted is None or counted[0] is not view:
                count = len(list(view._source))  # once per slice: history up to and including this request
            else:
                count = counted[1] + inner
            self._slice_counts[key] = (view, count)
            result = inner and (count - 1) in range(count)[view.s]
        elif type(view) is kmock.OrGroup:
            result = any([self._sees(source, request, seen) for source in view._sources])
        elif type(view) is kmock.AndGroup:
            result = all([self._sees(source, request, seen) for source in view._sources])
        elif type(view) is kmock.Exclusion:
            excluded = any([self._sees(source, request, seen) for source in view._exclusions])
            result = self._sees(view._source, request, seen) and not excluded
        elif type(view) is kmock.Stream:
            result = self._sees(view._source, request, seen) and bool(request._stream_bus.consumer_count)
        else:  # a view kind not known here: kmock's own (history-replaying) answer
            result = request in view
        seen[key] = result
        return result


def _may_match(criteria: Any, request: kmock.Request) -> bool:
    """False when the criteria's HTTP method or Kubernetes action is another member than the
    request's: kmock's own check would say no too, after a few regexp matches per field."""
    method = getattr(criteria, "method", ...)
    if isinstance(method, kmock.method) and isinstance(request.method, kmock.method) and method is not request.method:
        return False
    action = getattr(criteria, "action", ...)
    return not (isinstance(action, kmock.action) and action is not request.action)


def declare(
    emulator: kmock.KubernetesEmulator,
    key: str,
    kind: str,
    namespaced: bool = True,
    verbs: tuple[str, ...] = ("list", "watch", "get", "create", "patch", "update", "delete"),
    subresources: tuple[str, ...] = (),
) -> None:
    emulator.resources[key] = kmock.ResourceInfo(
        kind=kind, namespaced=namespaced, verbs=set(verbs), subresources=set(subresources)
    )


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator, HistoryFreeDispatch):
    """kmock's emulator with an API server's write semantics (see the module docstring)."""

    # False: as an API server still serving an older CRD without today's rules (objects that
    # slipped in before a rule existed); only the schema-free checks (names, labels) apply.
    crd_validation: bool = True
    # Addresses for Services (see the module docstring); a test may shrink it to fill it.
    service_ip_range: int = 65_534
    writes: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)
    dry_runs: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)
    _last_version: int = attrs.field(default=0, init=False)
    _slice_counts: dict[int, tuple[kmock.View, int]] = attrs.field(factory=dict, init=False)
    _order_cache: tuple[tuple[int, ...], list[kmock.Reaction], list[kmock.Reaction]] = attrs.field(
        default=((), [], []), init=False
    )
    # What a write request answers (dry runs are never stored), by id(request).
    _answers: dict[int, JsonObject] = attrs.field(factory=dict, init=False)
    # Services holding a cluster IP, by key.
    _cluster_ips: set[Key] = attrs.field(factory=set, init=False)
    # validate_custom_resource's verdict and defaulted spec, by the spec's JSON.
    _cr_verdicts: dict[str, tuple[list[str], Any]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback[kmock.method.PUT] << self._serve_update
        # kopf's backbone, then everything the operator owns or posts.
        declare(self, "v1/namespaces", "Namespace", namespaced=False, verbs=("list", "watch", "get"))
        declare(
            self,
            "apiextensions.k8s.io/v1/customresourcedefinitions",
            "CustomResourceDefinition",
            namespaced=False,
            verbs=("list", "watch", "get"),
        )
        declare(self, "v1/events", "Event", verbs=("create",))
        declare(self, CR_RESOURCE, "InferenceService", subresources=("status", "scale"))
        declare(self, "apps/v1/deployments", "Deployment", subresources=("status", "scale"))
        declare(self, "v1/services", "Service", subresources=("status",))
        declare(self, "policy/v1/poddisruptionbudgets", "PodDisruptionBudget", subresources=("status",))
        declare(self, "coordination.k8s.io/v1/leases", "Lease")
        declare(self, "autoscaling/v2/horizontalpodautoscalers", "HorizontalPodAutoscaler", subresources=("status",))
        declare(self, "keda.sh/v1alpha1/scaledobjects", "ScaledObject", subresources=("status",))
        declare(self, "keda.sh/v1alpha1/triggerauthentications", "TriggerAuthentication")
        declare(self, "v1/secrets", "Secret")
        declare(self, "v1/configmaps", "ConfigMap")
        declare(self, "networking.k8s.io/v1/networkpolicies", "NetworkPolicy")
        declare(self, "v1/pods", "Pod", subresources=("status",))
        declare(self, "resource.k8s.io/v1/resourceclaimtemplates", "ResourceClaimTemplate")
        # routing.inferencePool: the endpoint picker's identity and its RoleBinding.
        declare(self, "v1/serviceaccounts", "ServiceAccount")
        # Scale to zero: the operator watches the activator's slices and writes NAME-activator.
        declare(self, "discovery.k8s.io/v1/endpointslices", "EndpointSlice")
        declare(self, "rbac.authorization.k8s.io/v1/rolebindings", "RoleBinding")

    # --- request handling -------------------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> Any:
        verb = self._verb(request)
        if verb is None:
            return await HistoryFreeDispatch._handle(self, request)
        assert request.resource is not None
        sub = f"/{request.subresource}" if request.subresource else ""
        counter = self.dry_runs if request.params.get("dryRun") == "All" else self.writes
        key = (request.resource, request.namespace, request.name or "")
        creating = (
            counter is self.writes
            and verb == "apply"
            and not sub
            and (key not in self._objects or self._objects[key].deleted)
        )
        counted = "create" if creating else "update" if verb in ("apply", "patch", "put") else verb
        counter[f"{request.resource.plural}{sub}:{counted}"] += 1  # an apply that creates counts as a create
        released: Key | None = None
        async with self._lock:
            try:
                released = await self._write(request, verb)
            except kmock.KubernetesError as exc:
                return await self._render_error(exc)
        try:
            # The write is stored before reactions run: a reaction answering 500 leaves it
            # stored, as a write that landed but whose answer was lost.
            return await HistoryFreeDispatch._handle(self, request)
        finally:
            self._answers.pop(id(request), None)
            if released is not None:  # deleted, finalizers done: gone once answered
                async with self._lock:
                    raw = self._objects[released].raw
                    self._objects[released].delete()
                    self._cluster_ips.discard(released)
                    await self._buses[released[0]].put({"type": "DELETED", "object": raw})

    async def _render_error(self, exc: Exception) -> Any:
        """kmock's error answer, without formatting a traceback for the API's own errors
        (404s are routine: 3 ms each with one)."""
        if isinstance(exc, kmock.KubernetesError):
            body = {
                "apiVersion": "v1",
                "kind": "Status",
                "metadata": {},
                "code": exc.status,
                "status": "Failure",
                "reason": exc.reason or type(exc).__name__,
                "message": exc.message or repr(exc),
                "details": exc.details or {},
            }
            return aiohttp.web.json_response(body, status=exc.status)
        return await super()._render_error(exc)

    @staticmethod
    def _verb(request: kmock.Request) -> str | None:
        if request.resource is None:
            return None
        if request.action == kmock.action.CREATE:
            return "create"
        if request.name is None:
            return None
        if request.action == kmock.action.DELETE:
            return "delete"
        if request.method == kmock.method.PUT:
            return "put"
        if request.action == kmock.action.UPDATE:
            return "apply" if "apply-patch" in _content_type(request) else "patch"
        return None

    def _info(self, resource: Any) -> kmock.ResourceInfo | None:
        return self.resources[resource] if resource in self.resources else None

    def _has_status(self, resource: Any) -> bool:
        info = self._info(resource)
        return bool(info and "status" in info.subresources)

    def _kind(self, resource: Any, body: Any = None) -> apply.Kind:
        info = self._info(resource)
        kind = (info.kind if info else None) or (body or {}).get("kind") or str(resource.plural)
        builtin = resource.group == "" or "." not in resource.group or resource.group.endswith(".k8s.io")
        return apply.Kind(kind, builtin)

    def _stored(self, request: kmock.Request, name: str | None = None) -> Any:
        """The stored object a request addresses, by key (kmock scans every object)."""
        assert request.resource is not None
        key = (request.resource, request.namespace, name or request.name or "")
        return self._objects._objects.get(key)  # noqa: SLF001

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        obj = self._stored(request)
        if obj is None or obj.deleted:
            raise kmock.KubernetesObjectNotFoundError()
        return obj.raw

    async def _serve_create(self, request: kmock.Request) -> Any:
        return self._answers[id(request)]

    def _objects_of(self, request: kmock.Request) -> list[JsonObject]:
        """Live objects of the request's resource (and namespace, if it names one)."""
        return [
            obj.raw
            for (resource, namespace, _), obj in self._objects.items()
            if resource == request.resource
            and (request.namespace is None or namespace == request.namespace)
            and not obj.deleted
        ]

    async def _serve_list(self, request: kmock.Request) -> Any:
        if request.resource not in self._get_resources():
            raise kmock.KubernetesResourceNotFoundError()
        async with self._lock:
            items = self._objects_of(request)
            version = str(self._last_version)
        if selector := request.params.get("labelSelector"):
            items = [obj for obj in items if _labels_match(obj, selector)]
        return {"metadata": {"resourceVersion": version}, "items": items}

    async def _serve_watch(self, request: kmock.Request) -> Any:
        """kmock's watch, but from the `resourceVersion` asked for (a list's): only later changes
        are sent, as a real API server does, not every object again as ADDED. The bus position is
        taken under the lock, so no write falls between the replay and the stream."""
        yield b""
        since = _version(request.params.get("resourceVersion"))
        assert request.resource is not None
        bus = self._buses[request.resource]
        async with self._lock:
            marker = await bus.mark()
            replay = [
                {"type": "ADDED" if since is None else "MODIFIED", "object": obj}
                for obj in self._objects_of(request)
                if since is None or (_version(obj.get("metadata", {}).get("resourceVersion")) or 0) > since
            ]
        try:
            for event in replay:
                yield event
            async for event in bus.stream(since=marker):
                namespace = event.get("object", {}).get("metadata", {}).get("namespace")
                if request.namespace is None or namespace == request.namespace:
                    yield event
        finally:
            await bus.unmark(marker)

    async def _serve_update(self, request: kmock.Request) -> Any:
        return self._answers[id(request)]

    async def _serve_delete(self, request: kmock.Request) -> Any:
        return self._answers[id(request)]

    # --- writes -----------------------------------------------------------------------------

    def _next_version(self) -> str:
        self._last_version += 1
        return str(self._last_version)

    async def _write(self, request: kmock.Request, verb: str) -> Key | None:
        """Validate and store one write; the answer goes to `_answers`. Returns the key of an
        object to release after answering (deleted with its finalizers done)."""
        resource = request.resource
        assert resource is not None
        dry_run = request.params.get("dryRun") == "All"
        body = _body(request, verb)
        key = _write_key(request, verb, body)
        stored = self._objects._objects.get(key)  # noqa: SLF001
        live = None if stored is None or stored.deleted else stored.raw

        if verb == "delete":
            if live is None:
                raise kmock.KubernetesObjectNotFoundError()
            return await self._delete(key, live, dry_run, request)
        _check_existence(verb, live, key, request)
        kind = self._kind(resource, body)
        manager = request.params.get("fieldManager") or _default_manager(request)
        api_version = f"{resource.group}/{resource.version}" if resource.group else str(resource.version)
        if verb == "apply" and not request.params.get("fieldManager"):
            raise _error(400, "BadRequest", "PATCH with application/apply-patch+yaml requires a fieldManager")
        new = self._changed(live, body, verb, request, kind, manager, api_version)
        if live is None:
            new.setdefault("metadata", {})["name"] = key[2]
            if key[1] is not None:
                new["metadata"]["namespace"] = key[1]
        new = self._validated(resource, kind, live, new, live is None, request.subresource)

        if live is not None and _same(live, new):
            self._answers[id(request)] = live  # a no-op write stores nothing, as on a real server
            return None
        _stamp(new, live, self._next_version())
        if live is None and str(resource.plural) == "services" and (new.get("spec") or {}).get("clusterIP") != "None":
            self._allocate_cluster_ip(key, dry_run)
        self._answers[id(request)] = new
        if dry_run:
            return None
        return await self._store(key, stored, new, created=live is None)

    async def _store(self, key: Key, stored: Any, new: JsonObject, created: bool) -> Key | None:
        """Keep `new` as the object's latest version and tell its watchers; the key when the
        write finished a deletion (no finalizers left)."""
        if stored is None:
            self._objects[key] = new
        else:
            stored.history.append(new)
        await self._buses[key[0]].put({"type": "ADDED" if created else "MODIFIED", "object": new})
        meta = new["metadata"]
        if not created and meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return key
        return None

    def _changed(
        self,
        live: JsonObject | None,
        body: Any,
        verb: str,
        request: kmock.Request,
        kind: apply.Kind,
        manager: str,
        api_version: str,
    ) -> JsonObject:
        """The object as this write makes it, with its managedFields; `live` stays untouched."""
        sub = request.subresource or ""
        has_status = self._has_status(request.resource)
        if verb == "apply":
            force = request.params.get("force") == "true"
            return _applied(live, body, manager, kind, force, api_version, has_status)
        # Stored versions are never changed in place: `live` is read, `new` is built beside it
        # (kmock's merge patch copies only what changes; metadata is copied before stamping).
        new = _written(live, body, verb, sub, kind, _content_type(request), has_status)
        if live is not None and has_status:
            new = _status_kept_apart(live, new, sub)
        meta = new["metadata"] = dict(new.get("metadata") or {})
        given = meta.get("managedFields")
        previous = (live or {}).get("metadata", {}).get("managedFields")
        # A write that rewrites managedFields itself (csaupgrade's JSON patch) sets them.
        entries = apply.decode(given if given and given != previous else previous)
        entries = apply.record_update(live, new, entries, manager, kind, sub, api_version)
        meta["managedFields"] = apply.encode(entries)
        return new

    def _validated(
        self,
        resource: Any,
        kind: apply.Kind,
        live: JsonObject | None,
        new: JsonObject,
        creating: bool,
        subresource: str | None,
    ) -> JsonObject:
        """`new` as it is stored (defaults of a custom resource filled), or a 422 like the real one."""
        if subresource == "status":
            return new  # status is not judged against the schema here (the operator writes it)
        if str(resource.plural) == "inferenceservices":
            # Validation ratcheting: an update that leaves spec and name alone is not judged again.
            if not self.crd_validation or not creating and live is not None and _spec_of(new) == _spec_of(live):
                errors: list[str] = []
            else:
                errors, spec = self._cr_verdict(new)
                if not errors and spec is not None:
                    new["spec"] = spec
            errors += objectrules.label_errors((new.get("metadata") or {}).get("labels"), "metadata.labels")
        elif kind.builtin:
            errors = objectrules.object_errors(kind.kind, new, creating)
        else:
            meta = new.get("metadata") or {}
            errors = objectrules.name_errors(kind.kind, str(meta.get("name", ""))) if creating else []
            errors += objectrules.label_errors(meta.get("labels"), "metadata.labels")
        if errors:
            group = f".{resource.group}" if resource.group else ""
            name = (new.get("metadata") or {}).get("name", "")
            message = f'{kind.kind}{group} "{name}" is invalid: {"; ".join(errors)}'
            raise _error(422, "Invalid", message, {"name": name, "kind": kind.kind, "causes": errors})
        return new

    def _cr_verdict(self, obj: JsonObject) -> tuple[list[str], Any]:
        """validate_custom_resource's errors and the defaulted spec, memoised by spec: the
        generator rebuilds the schema on each call (~25 ms), too slow for 1,000 objects."""
        meta = obj.get("metadata") or {}
        name_problems = objectrules.name_errors("InferenceService", str(meta.get("name", "")))
        probe = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
        probe["metadata"] = {"name": "probe"}
        key = json.dumps(probe, sort_keys=True, default=str)
        if key not in self._cr_verdicts:
            errors = validate_custom_resource(probe)
            spec = None if errors else default_custom_resource(probe).get("spec")
            self._cr_verdicts[key] = (errors, spec)
        errors, spec = self._cr_verdicts[key]
        return name_problems + list(errors), copy.deepcopy(spec)

    def _allocate_cluster_ip(self, key: Key, dry_run: bool) -> None:
        if len(self._cluster_ips) >= self.service_ip_range:
            message = f'Internal error occurred: failed to allocate a serviceIP for Service "{key[2]}": range is full'
            raise _error(500, "InternalError", message)
        if not dry_run:
            self._cluster_ips.add(key)

    async def _delete(self, key: Key, live: JsonObject, dry_run: bool, request: kmock.Request) -> Key | None:
        stored = self._objects[key]
        self._answers[id(request)] = live
        if dry_run or live["metadata"].get("deletionTimestamp"):
            return None
        if live["metadata"].get("finalizers"):
            new = copy.deepcopy(live)
            new["metadata"]["deletionTimestamp"] = apply.now()
            new["metadata"]["resourceVersion"] = self._next_version()
            stored.history.append(new)
            self._answers[id(request)] = new
            await self._buses[key[0]].put({"type": "MODIFIED", "object": new})
            return None
        stored.delete()
        self._cluster_ips.discard(key)
        await self._buses[key[0]].put({"type": "DELETED", "object": live})
        return None


def _version(text: Any) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _content_type(request: kmock.Request) -> str:
    for name, value in request.headers.items():
        if name.lower() == "content-type":
            return str(value).lower()
    return ""


def _write_key(request: kmock.Request, verb: str, body: Any) -> Key:
    """The stored object a write addresses; a create names it (generateName gets a suffix)."""
    assert request.resource is not None
    if verb != "create":
        assert request.name is not None
        return request.resource, request.namespace, request.name
    meta = body.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
    return request.resource, request.namespace or meta.get("namespace"), meta.get("name") or ""


def _check_existence(verb: str, live: JsonObject | None, key: Key, request: kmock.Request) -> None:
    """409 for a create over a live object, 404 for a change to a missing one."""
    plural = key[0].plural
    if verb == "create" and live is not None:
        raise _error(409, "AlreadyExists", f'{plural} "{key[2]}" already exists')
    if verb in ("patch", "put") and live is None or verb == "apply" and live is None and request.subresource:
        raise _error(404, "NotFound", f'{plural} "{key[2]}" not found')


def _stamp(new: JsonObject, live: JsonObject | None, version: str) -> None:
    """What the server sets on a stored version: uid, creation time and generation (kept from
    `live`, the generation bumped when the spec changed) and a new resourceVersion."""
    meta = new.setdefault("metadata", {})
    if live is None:
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = apply.now()
        meta["generation"] = 1
    else:
        for field in ("uid", "creationTimestamp", "generation", "deletionTimestamp"):
            if field in live["metadata"]:
                meta[field] = live["metadata"][field]
            else:
                meta.pop(field, None)
        if _spec_of(new) != _spec_of(live):
            meta["generation"] = live["metadata"].get("generation", 1) + 1
    meta["resourceVersion"] = version


def _applied(
    live: JsonObject | None,
    body: Any,
    manager: str,
    kind: apply.Kind,
    force: bool,
    api_version: str,
    has_status: bool,
) -> JsonObject:
    """A server-side apply of `body` by `manager` over `live` (see testsupport/apply.py)."""
    if not isinstance(body, dict):
        raise _error(400, "BadRequest", "an apply patch must be an object")
    applied = {k: v for k, v in body.items() if not (has_status and k == "status")}
    applied["metadata"] = {
        k: v for k, v in (body.get("metadata") or {}).items() if k in apply.METADATA_FIELDS or k == "name"
    }
    _check_version(live, body)
    try:
        new, entries = apply.apply(live, applied, manager, kind, force, api_version)
    except apply.ApplyConflict as exc:
        raise _error(409, "Conflict", str(exc)) from exc
    if live is not None and has_status and "status" in live:
        new["status"] = live["status"]
    new.setdefault("metadata", {})["managedFields"] = apply.encode(entries)
    return new


def _written(
    live: JsonObject | None, body: Any, verb: str, sub: str, kind: apply.Kind, content_type: str, has_status: bool
) -> JsonObject:
    """The object after a create, put, scale or patch (managed fields not yet recorded)."""
    if verb == "create":
        new = copy.deepcopy(body) if isinstance(body, dict) else {}
        if has_status:
            new.pop("status", None)
        return new
    assert live is not None  # _check_existence refused a change to a missing object
    if verb == "put":
        _check_version(live, body)
        return copy.deepcopy(body)
    if sub == "scale":
        replicas = (body.get("spec") or {}).get("replicas") if isinstance(body, dict) else None
        new = {**live, "spec": {**(live.get("spec") or {})}}
        if replicas is not None:
            new["spec"]["replicas"] = replicas
        return new
    _check_version(live, body)
    try:
        if "strategic-merge-patch" in content_type and isinstance(body, dict):
            return apply.merge(copy.deepcopy(live), copy.deepcopy(body), kind, strategic=True)
        return dict(dicts.patch_dict(live, body))
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, ValueError, TypeError) as exc:
        raise _error(422, "Invalid", f"the patch cannot be applied: {exc}") from exc


def _status_kept_apart(old: JsonObject, new: JsonObject, sub: str) -> JsonObject:
    """The object's own endpoint ignores status; /status changes status only."""
    if sub == "status":
        new = {**old, "status": new.get("status"), "metadata": new.get("metadata", old.get("metadata"))}
        if new["status"] is None:
            new.pop("status")
    elif "status" in old:
        new["status"] = old["status"]
    else:
        new.pop("status", None)
    return new


def _body(request: kmock.Request, verb: str) -> Any:
    """The request's body: JSON, or YAML for apply patches; a JSON patch is a list."""
    if verb == "delete":
        return None
    data = request.data
    if data is None and request.text:
        try:
            data = yaml.safe_load(request.text)
        except yaml.YAMLError as exc:
            raise _error(400, "BadRequest", f"the body is neither JSON nor YAML: {exc}") from exc
    if isinstance(data, dict) or isinstance(data, list) and verb == "patch":
        return data  # parsed for this request alone; never stored as is
    raise _error(400, "BadRequest", "the request body must be an object")


def _default_manager(request: kmock.Request) -> str:
    """What the API server names a manager that did not say: the User-Agent's product."""
    agent = next((str(v) for k, v in request.headers.items() if k.lower() == "user-agent"), "")
    return agent.split("/", 1)[0].strip() or "unknown"


def _check_version(live: JsonObject | None, body: Any) -> None:
    """Optimistic concurrency: a write naming a resourceVersion must name the current one."""
    if live is None or not isinstance(body, dict):
        return
    wanted = (body.get("metadata") or {}).get("resourceVersion")
    if wanted and wanted != live["metadata"].get("resourceVersion"):
        raise _error(409, "Conflict", "the object has been modified; please apply your changes to the latest version")


def _spec_of(obj: JsonObject) -> JsonObject:
    """Everything but metadata and status: what `metadata.generation` counts changes of."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _same(live: JsonObject, new: JsonObject) -> bool:
    """Whether a write changes nothing (managedFields timestamps aside)."""

    def strip(obj: JsonObject) -> JsonObject:
        meta = {k: v for k, v in obj.get("metadata", {}).items() if k not in ("resourceVersion", "managedFields")}
        managed = [
            {k: v for k, v in e.items() if k != "time"} for e in obj.get("metadata", {}).get("managedFields", [])
        ]
        return {**obj, "metadata": meta, "managed": managed}

    return strip(live) == strip(new)


def _error(status: int, reason: str, message: str, details: Any = None) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=status, reason=reason, message=message, details=details or {})


def _labels_match(obj: JsonObject, selector: str) -> bool:
    """Whether `obj` has every `key=value` (or `key==value`) label of an equality-based selector."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, _, value = term.replace("==", "=").partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True
