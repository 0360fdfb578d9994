"""CR fuzzing: InferenceServices drawn from the CRD's schema, valid and corrupted.

Every spec either fails schema validation with a message naming the field, or renders to
objects that pass kubernetes-validate (and the API server's label/name rules); the operator's
handler never raises anything but a PermanentError on any of them, called directly or when the
real operator process meets them through the emulated API.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import itertools
import logging
import os
import re
from collections.abc import Iterator

import kopf
import kubernetes
import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kopf._core.engines import posting

from inference_operator import credentials
from inference_operator.builders import Owner
from inference_operator.config import OperatorConfig
from inference_operator.handlers import service as service_handlers
from inference_operator.handlers import startup
from inference_operator.k8s import KubeApi
from inference_operator.models import LABEL_KEY_PATTERN, LABEL_VALUE_PATTERN, SpecError, parse_spec
from inference_operator.stages import rendered
from tests.strategies import JUNK, from_schema, leaf_paths
from testsupport.cluster import Cluster, captured_operator_logs, running_cluster, wait_for
from testsupport.crd import addon_errors, apply_defaults, crd_schema, schema_errors, validate_custom_resource

SPEC_SCHEMA = crd_schema()["properties"]["spec"]
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
names = itertools.count()


def cr(spec: dict, name: str = "fuzz") -> dict:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": spec,
    }


def api_server_problems(obj: dict) -> list[str]:
    """What the API server checks in code rather than in its OpenAPI schema."""
    problems = []
    pod = (obj.get("spec") or {}).get("template", {}).get("spec", {})  # a ServiceAccount has no spec
    labels = {**obj["metadata"].get("labels", {}), **pod.get("nodeSelector", {})}
    for key, value in labels.items():
        if not re.match(LABEL_KEY_PATTERN, key) or not re.match(LABEL_VALUE_PATTERN, value) or len(value) > 63:
            problems.append(f"label {key}={value}")
    for volume in pod.get("volumes", []):
        claim = volume.get("persistentVolumeClaim", {}).get("claimName")
        if claim is not None and not DNS_SUBDOMAIN.match(claim):
            problems.append(f"claimName {claim!r}")
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        env_names = [e["name"] for e in container.get("env", [])]
        if len(env_names) != len(set(env_names)):
            problems.append(f"duplicate env in {container['name']}")
        if not container.get("image", "").strip() or container["image"] != container["image"].strip():
            problems.append(f"image {container.get('image')!r}")
    return problems


def assert_renders_valid(spec) -> None:
    for obj in rendered(Owner(name="fuzz", namespace="ml", uid="u-1", spec=spec)):
        if (errors := addon_errors(obj)) is not None:  # HTTPRoute: the Gateway API's, as a stand-in
            assert errors == [], errors
            continue
        if obj["apiVersion"].startswith(("keda.sh/", "inference.networking.k8s.io/")):
            continue  # an add-on's CRD (KEDA, Inference Extension): kubernetes-validate has no schema for it
        # resource.k8s.io/v1 (allocation: dra) is served from Kubernetes 1.34 on.
        version = "1.34" if obj["apiVersion"].startswith("resource.k8s.io/") else "1.33"
        kubernetes_validate.validate(obj, version, strict=True)
        assert api_server_problems(obj) == []


@FUZZ
@given(from_schema(SPEC_SCHEMA))
def test_fuzz_schema_valid_specs_render_valid_objects(spec: dict) -> None:
    assert schema_errors(cr(spec)) == []
    verdict = validate_custom_resource(cr(spec))  # the API server's: its CEL rules may refuse it
    try:
        parsed = parse_spec(apply_defaults(SPEC_SCHEMA, spec))
    except SpecError as exc:
        assert verdict, f"the model refuses what the API server accepts: {exc}"
        assert exc.field.startswith("spec")
        return
    assert verdict == [], f"the model accepts what the API server refuses: {verdict}"
    assert_renders_valid(parsed)


def _set(obj: dict, path: tuple, value) -> None:
    for part in path[:-1]:
        if not isinstance(obj.get(part), dict):
            obj[part] = {}
        obj = obj[part]
    obj[path[-1]] = value


@FUZZ
@given(from_schema(SPEC_SCHEMA), st.sampled_from(leaf_paths(SPEC_SCHEMA)), JUNK)
def test_fuzz_corrupted_specs_are_refused_naming_the_field(spec: dict, path: tuple, junk) -> None:
    spec = copy.deepcopy(spec)
    _set(spec, path, junk)
    errors = schema_errors(cr(spec))
    try:
        parsed = parse_spec(apply_defaults(SPEC_SCHEMA, spec) if not errors else spec)
    except SpecError as exc:
        assert exc.field.startswith("spec"), exc
        if errors:  # the schema refuses it too, and says where
            dotted = "spec." + ".".join(path)
            where = [e.split(":")[0] for e in errors]  # on the corrupted branch, above or below
            assert any(w.startswith(dotted) or dotted.startswith(w) for w in where), (errors, dotted)
        return
    # The model accepted it: whatever it is, it must still become valid objects.
    assert_renders_valid(parsed)


# -- the handler itself, called directly (no kopf reactor) and through the running operator --


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("fuzz")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def direct_memo(shared_cluster: Cluster) -> Iterator[kopf.Memo]:
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=shared_cluster.url))
    # The operator's memo as `handlers.startup.configure` makes it, with this cluster's client.
    memo = kopf.Memo(api=KubeApi(client), config=OperatorConfig.from_environ(os.environ), tracing=None)
    startup.configure(settings=kopf.OperatorSettings(), memo=memo)
    # kopf.info()/warn() outside the reactor: give them a queue to post into.
    loop = asyncio.new_event_loop()
    tokens = [
        (posting.settings_var, posting.settings_var.set(kopf.OperatorSettings())),
        (posting.event_queue_loop_var, posting.event_queue_loop_var.set(loop)),
        (posting.event_queue_var, posting.event_queue_var.set(asyncio.Queue())),
    ]
    yield memo
    for var, token in reversed(tokens):
        var.reset(token)
    loop.close()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.one_of(
        from_schema(SPEC_SCHEMA), st.dictionaries(st.sampled_from(list(SPEC_SCHEMA["properties"])), JUNK, max_size=3)
    )
)
def test_fuzz_handler_only_raises_permanent_errors(shared_cluster: Cluster, direct_memo, spec) -> None:
    name = f"direct-{next(names)}"
    body = cr(spec, name)
    body["metadata"].update(uid=f"uid-{name}", generation=1)
    shared_cluster.emulator.objects["inference.rocm.dev/v1alpha1/inferenceservices", "ml", name] = body
    stored = shared_cluster.get_cr("ml", name)
    context = contextvars.copy_context()
    try:
        context.run(
            service_handlers.reconcile_service,
            body=stored,
            meta=stored["metadata"],
            spec=stored["spec"],
            memo=direct_memo,
            logger=logging.getLogger("fuzz"),
            retry=0,
        )
    except kopf.PermanentError:
        degraded = [c for c in shared_cluster.get_cr("ml", name)["status"]["conditions"] if c["type"] == "Degraded"][0]
        assert degraded["status"] == "True" and degraded["reason"] in ("InvalidSpec", "ApplyFailed", "PolicyViolation")
        # Each names what it refused: a spec field, or (the platform's policy) the field's path.
        assert degraded["message"].startswith(("spec", "scheduling.", "runtime.", "model."))
    except kopf.TemporaryError:
        # A credential the spec names but may not use (credentials.py), or an add-on API the
        # cluster does not serve (the emulator has no InferencePool CRD): reported, looked at again.
        degraded = [c for c in shared_cluster.get_cr("ml", name)["status"]["conditions"] if c["type"] == "Degraded"][0]
        assert degraded["status"] == "True" and degraded["reason"] in (*credentials.REFUSALS, "ApiUnavailable")
    else:
        assert shared_cluster.get("apps/v1/deployments", "ml", name) is not None
        assert shared_cluster.get_cr("ml", name)["status"]["url"].startswith(f"http://{name}.ml.")


@pytest.mark.slow
@pytest.mark.integration
def test_fuzz_operator_process_survives_generated_services(cluster: Cluster) -> None:
    from kopf.testing import KopfRunner

    specs: list[dict] = []
    from_schema_examples = st.one_of(
        from_schema(SPEC_SCHEMA),
        st.fixed_dictionaries(
            {"model": st.fixed_dictionaries({"uri": st.just("pvc://m")})},
            optional={k: JUNK for k in ("resources", "runtime", "autoscaling", "replicas")},
        ),
    )

    @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(from_schema_examples)
    def collect(spec: dict) -> None:
        specs.append(spec)

    collect()
    args = ["run", "--all-namespaces", "--standalone", "-m", "inference_operator.handlers"]
    with captured_operator_logs() as logs, KopfRunner(args, timeout=90) as runner:
        accepted = []
        for i, spec in enumerate(specs):
            response = cluster.apply_cr(cr(spec, f"gen-{i}"))
            assert response.status_code in (200, 201, 422), response.text
            if response.status_code != 422:
                accepted.append(f"gen-{i}")
                continue
            assert "spec" in response.json()["message"]

        def settled(name: str) -> bool:
            status = (cluster.get_cr("ml", name) or {}).get("status") or {}
            reasons = {c["type"]: c for c in status.get("conditions", [])}
            # Served, or refused with a reason: the spec, the platform's policy, or a credential
            # it names but may not use (a generated Secret name that does not exist).
            refused = ("InvalidSpec", "PolicyViolation", *credentials.REFUSALS)
            return bool(status.get("url")) or reasons.get("Degraded", {}).get("reason") in refused

        wait_for(lambda: all(settled(n) for n in accepted), timeout=60, message="every service settled")
    assert runner.exit_code == 0, runner.output
    assert logs.count("failed with an exception. Will retry") == 0
    assert logs.count("Unhandled") == 0
