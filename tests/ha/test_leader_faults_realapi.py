"""Faults of the operator's own replicas, two of them peered (`--peering`), on a real API server.

- The leader is SIGKILLed (as the OOM killer ends a process: no cleanup, no goodbye in the
  peering) halfway through a spec change: its Deployment written, its status not. The standby
  takes over, the change lands, nothing is written twice for it, and the two never write in turn.
- One replica's wall clock steps 10 minutes ahead of, or behind, the other's (libfaketime, on
  that process alone; the machine's clock is never touched). Still one replica writes at a time,
  and one leads: the standby stays paused while the leader lives, and takes over when it dies.

Each replica is its own API user, so the audit log (the API server's clock) says who wrote what.
The module runs an API server of its own: the tier's shared operator must not reconcile here.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import pathlib
import shutil
from collections.abc import Iterator

import pytest
import yaml

from tests.reconcile.test_operator_realapi import apply_cr, container, deployment, isvc, namespace, observed, resnet
from tests.tiers.realapi import Operator, own_apiserver
from testsupport.envtest import (
    OPERATOR_USER,
    OPERATOR_USERS,
    RBAC,
    SECOND_OPERATOR_USER,
    ApiServer,
    Write,
)
from testsupport.waiting import eventually

pytestmark = [pytest.mark.realapi, pytest.mark.slow, pytest.mark.integration]

PEERING = "rocm-inference-operator"
#: The replicas' keep-alive lifetime (INFERENCE_OPERATOR_PEERING_LIFETIME): it bounds a takeover.
LIFETIME = 10
#: A takeover: the dead leader's keep-alive expiring, the standby's resume, its reconcile.
TAKEOVER_S = LIFETIME + 90
#: The step of one replica's clock, either way.
STEP_S = 600
LIBFAKETIME = pathlib.Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
_replicas = itertools.count()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """An API server of this module's own, with kopf's peering rules for both operator users
    (the chart's, given with `--peering`) and the peering object."""
    with own_apiserver(tmp_path_factory, "envtest-leader") as (api, _):
        name = "inference-operator-peering"
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": yaml.safe_load((RBAC / "peering-cluster.yaml").read_text()),
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u} for u in OPERATOR_USERS],
        }
        peering = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": PEERING}}
        api.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([role, binding, peering]))
        yield api


class Replica(Operator):
    """One peered replica: its API user, priority, and (under libfaketime) a clock of its own,
    shifted by what `step` writes to its timestamp file."""

    def __init__(self, server: ApiServer, work: pathlib.Path, user: str, priority: int, faked: bool = False):
        self.identity = f"replica-{next(_replicas)}-p{priority}"
        self.clock = work / f"{self.identity}.faketime"
        env = {"POD_ID": self.identity, "INFERENCE_OPERATOR_PEERING_LIFETIME": str(LIFETIME)}
        if faked:
            self.clock.write_text("+0\n")
            env |= {
                "LD_PRELOAD": str(LIBFAKETIME),
                "FAKETIME_TIMESTAMP_FILE": str(self.clock),
                "FAKETIME_CACHE_DURATION": "1",  # the file re-read every second
                # The wall clock steps, the monotonic clock does not: what an NTP step does.
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            }
        args = ("--peering", PEERING, "--priority", str(priority))
        super().__init__(server, work / f"{self.identity}.log", user=user, args=args, env=env)

    def step(self, seconds: int) -> None:
        self.clock.write_text(f"{seconds:+d}\n")

    def leading(self) -> bool:
        """Resumed after the pause it starts in, and not paused again since (kopf's log lines)."""
        text = self.text()
        return text.rfind("Resuming operations after the pause") > text.rfind("Pausing operations in favour of")

    def paused(self) -> bool:
        """Its watch of InferenceServices paused (as a replica starts), and not resumed since."""
        return "Pausing the watch-stream for inferenceservices" in self.text() and not self.leading()


def keepalives(server: ApiServer) -> dict[str, str]:
    """identity → `lastseen` of each keep-alive in the peering object."""
    obj = json.loads(server.kubectl("get", "clusterkopfpeering", PEERING, "-o", "json").stdout)
    return {k: v["lastseen"] for k, v in (obj.get("status") or {}).items() if v and v.get("lifetime", 0) > 0}


def wait_renewals(server: ApiServer, replica: Replica, count: int) -> None:
    """Until `replica` has written the peering object `count` more times (keep-alives, from the
    audit log): each write is a peering event every replica re-judges its peers on."""

    def writes() -> int:
        return sum(1 for w in server.write_events() if w.user == replica.user and w.key.startswith("clusterkopf"))

    start = writes()
    what = f"{count} keep-alives of {replica.identity}"
    eventually(lambda: writes() >= start + count, timeout=count * LIFETIME * 3, what=what)


@contextlib.contextmanager
def peered(server: ApiServer, tmp_path: pathlib.Path, faked: bool) -> Iterator[tuple[Replica, Replica]]:
    """A leader (priority 200, the operator's user) and, once it leads, a standby (priority 100,
    the second user; its clock faked with `faked`), once it pauses."""
    leader = Replica(server, tmp_path, OPERATOR_USER, 200)
    standby = Replica(server, tmp_path, SECOND_OPERATOR_USER, 100, faked=faked)
    try:
        leader.start()
        eventually(leader.leading, timeout=120, what="the leader's resumption")
        standby.start()
        eventually(standby.paused, timeout=120, what="the standby's pause")
        yield leader, standby
    finally:
        for replica in (leader, standby):
            if replica.process is not None:
                replica.kill()


@pytest.fixture
def pair(server: ApiServer, tmp_path: pathlib.Path) -> Iterator[tuple[Replica, Replica]]:
    with peered(server, tmp_path, faked=False) as replicas:
        yield replicas


@pytest.fixture
def faked_pair(server: ApiServer, tmp_path: pathlib.Path) -> Iterator[tuple[Replica, Replica]]:
    """The pair, the standby's clock under libfaketime."""
    if not (shutil.which("faketime") and LIBFAKETIME.is_file()):
        pytest.skip("libfaketime is not installed (Debian package faketime; scripts/setup.sh installs it)")
    with peered(server, tmp_path, faked=True) as replicas:
        yield replicas


def workload_writes(server: ApiServer) -> list[Write]:
    """Every write of either replica but its keep-alives, in the API server's order."""
    return [w for w in server.write_events() if not w.key.startswith("clusterkopfpeerings")]


def turns(writes: list[Write]) -> list[str]:
    """The users in the order they wrote, each run of one user's writes as one entry: more
    entries than users means two replicas wrote in turn, both active at once."""
    return [user for user, _ in itertools.groupby(w.user for w in writes)]


def hold_status_writes(server: ApiServer, user: str) -> None:
    """An admission policy that refuses `user`'s InferenceService status writes: a reconcile of
    that user's stops after its objects are written, before the status says so."""
    name = f"hold-status-{user}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["inference.rocm.dev"],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        "resources": ["inferenceservices/status"],
                    }
                ]
            },
            "matchConditions": [{"name": "user", "expression": f"request.userInfo.username == {user!r}"}],
            "validations": [{"expression": "false", "message": "status writes held"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    server.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([policy, binding]))


def test_the_leader_killed_mid_reconcile_is_replaced_and_nothing_is_written_twice(
    server: ApiServer, pair: tuple[Replica, Replica]
) -> None:
    leader, standby = pair
    start = len(workload_writes(server))
    ns = namespace(server)
    apply_cr(server, ns, "a", resnet(gpus=1))
    eventually(lambda: observed(server, ns, "a"), timeout=120, what="a's first reconcile, by the leader")

    hold_status_writes(server, leader.user)
    try:
        # The policy is in force once a dry run of the leader's status write is refused.
        def held() -> bool:
            with server.client() as client:
                answer = client.patch(
                    f"/apis/inference.rocm.dev/v1alpha1/namespaces/{ns}/inferenceservices/a/status",
                    params={"dryRun": "All"},
                    content=json.dumps({"status": {"observedGeneration": 0}}),
                    headers={"Impersonate-User": leader.user, "Content-Type": "application/merge-patch+json"},
                )
            return answer.status_code >= 400 and "status writes held" in answer.text

        eventually(held, timeout=60, what="the admission policy in force")
        before = len(workload_writes(server))
        apply_cr(server, ns, "a", resnet(gpus=2))
        # The leader is halfway: the change's Deployment written, its status refused.
        eventually(
            lambda: (
                container(deployment(server, ns, "a") or {"spec": {"template": {"spec": {"containers": [{}]}}}})
                .get("resources", {})
                .get("limits", {})
                .get("amd.com/gpu")
                == "2"
            ),
            timeout=120,
            what="the change's Deployment, written by the leader",
        )
        eventually(lambda: "status writes held" in leader.text(), timeout=60, what="the leader's refused status")
        assert not observed(server, ns, "a")
        leader.kill()
        assert leader.identity in keepalives(server)  # no goodbye: its keep-alive has to expire

        eventually(lambda: observed(server, ns, "a"), timeout=TAKEOVER_S, what="the change, landed by the standby")
        assert standby.leading() and standby.process is not None and standby.process.poll() is None
    finally:
        name = f"hold-status-{leader.user}"
        server.kubectl("delete", f"validatingadmissionpolicybinding/{name}", f"validatingadmissionpolicy/{name}")
    change = workload_writes(server)[before:]
    ours = [w for w in change if w.name == "a" and not w.key.startswith("events")]
    # The Deployment written once for the change (by the leader), never again by the standby;
    # the standby wrote the status the leader could not.
    assert [(w.user, w.key) for w in ours if w.key.startswith("deployments")] == [(leader.user, "deployments:patch")], (
        ours
    )
    assert (standby.user, "inferenceservices/status:patch") in [(w.user, w.key) for w in ours], ours
    assert turns(workload_writes(server)[start:]) == [leader.user, standby.user], change


def test_a_standby_whose_clock_steps_ahead_stays_paused(server: ApiServer, faked_pair: tuple[Replica, Replica]) -> None:
    """The standby's clock steps 10 minutes ahead: the leader's keep-alives are no older to it
    than before, and it never resumes while the leader renews them."""
    leader, standby = faked_pair
    before = len(workload_writes(server))
    standby.step(+STEP_S)
    # Keep-alives on both sides after the step (the faked clock is re-read within a second):
    # each is a peering event both replicas judge each other on.
    wait_renewals(server, standby, 2)
    wait_renewals(server, leader, 3)
    ns = namespace(server)
    for name in ("a", "b"):
        apply_cr(server, ns, name, resnet(gpus=1))
    apply_cr(server, ns, "a", resnet(gpus=2))
    eventually(lambda: observed(server, ns, "a") and observed(server, ns, "b"), timeout=120, what="both services")
    wait_renewals(server, leader, 2)

    after = workload_writes(server)[before:]
    assert after and {w.user for w in after} == {leader.user}, turns(after)
    assert standby.paused() and leader.leading(), standby.text()[-3000:]
    assert leader.identity in keepalives(server), "the standby removed the live leader's keep-alive"


def test_a_standby_whose_clock_steps_behind_takes_over_in_one_lifetime(
    server: ApiServer, faked_pair: tuple[Replica, Replica]
) -> None:
    """The standby's clock steps 10 minutes behind: the leader's last keep-alive does not look
    10 minutes younger to it; once the leader is killed, the standby takes over within the
    keep-alive's lifetime (plus its resume), not the step."""
    leader, standby = faked_pair
    before = len(workload_writes(server))
    standby.step(-STEP_S)
    wait_renewals(server, standby, 2)
    wait_renewals(server, leader, 2)
    assert standby.paused(), standby.text()[-3000:]
    leader.kill()

    ns = namespace(server)
    apply_cr(server, ns, "c", resnet(gpus=1))
    eventually(lambda: observed(server, ns, "c"), timeout=TAKEOVER_S, what="c, reconciled by the standby")
    assert standby.leading()
    assert turns(workload_writes(server)[before:]) == [standby.user]
    status = (isvc(server, ns, "c") or {}).get("status") or {}
    assert status.get("observedGeneration") == 1
