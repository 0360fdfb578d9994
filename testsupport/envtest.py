"""A real kube-apiserver and etcd on loopback, the way controller-runtime's envtest runs them.

`KUBEBUILDER_ASSETS` names a directory with `kube-apiserver` and `etcd` (envtest's convention;
`setup-envtest use -p path` prints one), else envtest's default /usr/local/kubebuilder/bin.
No controllers run: no Deployment controller, no scheduler, no garbage collector. Tests play
those parts where they need them (a Deployment's status is written through its subresource).

Users are static tokens: `admin` (system:masters) for the test's own kubectl, and
`inference-operator`, bound to exactly the chart's ClusterRole rules, for the operator, so
every request the operator sends is authorized as it would be in a cluster. An audit log
records every write the operator makes, which is how writes per reconcile are counted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import yaml

from inference_operator.builders.endpoint_picker import CLUSTER_ROLE as PICKER_CLUSTER_ROLE
from inference_operator.builders.router import CLUSTER_ROLE as ROUTER_CLUSTER_ROLE
from inference_operator.jsontypes import JsonObject
from testsupport.processes import free_port, stop
from testsupport.waiting import eventually

ROOT = pathlib.Path(__file__).resolve().parents[1]
RBAC = ROOT / "charts" / "rocm-inference-operator" / "files" / "rbac"
CRD_DIRS = (ROOT / "crds", ROOT / "charts" / "rocm-inference-operator" / "crds")
STAND_IN_CRDS = ROOT / "testsupport" / "crds"
ASSETS_ENV = "KUBEBUILDER_ASSETS"
DEFAULT_ASSETS = pathlib.Path("/usr/local/kubebuilder/bin")
OPERATOR_USER = "inference-operator"
# A second operator replica's user, bound to the same rules: with one user per replica, the
# audit log says which replica made each write (tests/ha/test_leader_faults_realapi.py).
SECOND_OPERATOR_USER = "inference-operator-2"
OPERATOR_USERS = (OPERATOR_USER, SECOND_OPERATOR_USER)
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")


def audit_policy(reads: bool = False) -> JsonObject:
    """The operator's writes (and, with `reads`, every request it makes) at Metadata level."""
    operator_rule: JsonObject = {"level": "Metadata", "users": list(OPERATOR_USERS)}
    if not reads:
        operator_rule["verbs"] = list(WRITE_VERBS)
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [operator_rule, {"level": "None"}],
    }


def write_key(event: JsonObject) -> str | None:
    """`resource[/subresource]:verb` of an audit event that is a completed, successful, real
    (not dry-run) write; None for anything else."""
    if event.get("stage") != "ResponseComplete" or event.get("verb") not in WRITE_VERBS:
        return None
    if "dryRun=All" in event.get("requestURI", "") or (event.get("responseStatus") or {}).get("code", 500) >= 400:
        return None
    ref = event.get("objectRef") or {}
    sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
    return f"{ref.get('resource')}{sub}:{event['verb']}"


class AuditTail:
    """Reads an audit log incrementally: requests (distinct audit IDs) and each one's
    `resource[/subresource]:verb`, writes by kind, and whether a watch on a resource was
    started, without re-reading what was read before."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self._offset = 0
        self._partial = b""
        self._ids: set[str] = set()
        self.writes: Counter[str] = Counter()
        self.by_kind: Counter[str] = Counter()
        self.watched: set[str] = set()

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as log:
            log.seek(self._offset)
            chunk = log.read()
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            event = json.loads(line)
            if (audit_id := event.get("auditID", "")) not in self._ids:
                self._ids.add(audit_id)
                ref = event.get("objectRef") or {}
                sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
                self.by_kind[f"{ref.get('resource')}{sub}:{event.get('verb')}"] += 1
            if event.get("verb") == "watch":
                self.watched.add((event.get("objectRef") or {}).get("resource", ""))
            if key := write_key(event):
                self.writes[key] += 1

    @property
    def requests(self) -> int:
        return len(self._ids)


def assets() -> pathlib.Path | None:
    """The directory with kube-apiserver and etcd, or None when this machine has none (or no
    kubectl and openssl, which the tier drives them with)."""
    directory = pathlib.Path(os.environ.get(ASSETS_ENV) or DEFAULT_ASSETS)
    tools = shutil.which("kubectl") and shutil.which("openssl")
    if tools and all((directory / name).is_file() for name in ("kube-apiserver", "etcd")):
        return directory
    return None


SKIP_REASON = (
    "real-apiserver tier: no kube-apiserver and etcd in $KUBEBUILDER_ASSETS or /usr/local/kubebuilder/bin, "
    "or no kubectl/openssl (envtest's layout; see tests/tiers/realapi.md)"
)


@dataclasses.dataclass(frozen=True)
class Write:
    """One write in the audit log: when the API server completed it (RFC 3339, its clock), by
    whom, `resource[/subresource]:verb`, and the object's name."""

    at: str
    user: str
    key: str
    name: str


@dataclasses.dataclass
class ApiServer:
    url: str
    work: pathlib.Path
    admin_token: str
    operator_token: str
    # The processes by name ("etcd", "kube-apiserver"): what a benchmark reads their CPU time from.
    pids: dict[str, int] = dataclasses.field(default_factory=dict)
    # How each was started (arguments, log), and the running process: what `restart` repeats.
    commands: dict[str, tuple[list[str], pathlib.Path]] = dataclasses.field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)
    # Tokens of users other than admin and OPERATOR_USER (SECOND_OPERATOR_USER's).
    tokens: dict[str, str] = dataclasses.field(default_factory=dict)

    def start(self) -> None:
        """etcd, then kube-apiserver, as `commands` says (their logs appended); ready on return."""
        for name in ("etcd", "kube-apiserver"):
            args, log = self.commands[name]
            with log.open("ab") as out:
                self.processes[name] = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
            self.pids[name] = self.processes[name].pid
        apiserver = self.processes["kube-apiserver"]
        with self.client() as client:

            def ready() -> bool:
                assert apiserver.poll() is None, (self.work / "apiserver.log").read_text()[-3000:]
                return client.get("/readyz").status_code == 200

            eventually(ready, timeout=120, interval=0.3, what="kube-apiserver", ignore=(httpx.HTTPError,))

    def stop(self) -> None:
        """kube-apiserver, then etcd, stopped as a node's shutdown stops them (SIGTERM)."""
        for name in ("kube-apiserver", "etcd"):
            if name in self.processes:
                stop(self.processes.pop(name))

    def restart(self, down_s: float = 0.0) -> None:
        """Both stopped, `down_s` seconds of no API server, both started again on the same ports
        and data: what a control plane's restart (an upgrade, a node reboot) looks like to clients."""
        self.stop()
        time.sleep(down_s)
        self.start()

    @property
    def audit_log(self) -> pathlib.Path:
        return self.work / "audit.log"

    def kubeconfig(self, user: str) -> pathlib.Path:
        """A kubeconfig for `admin` or the operator's user (TLS unverified: a self-signed server)."""
        path = self.work / f"kubeconfig-{user}.yaml"
        if not path.exists():
            token = {"admin": self.admin_token, OPERATOR_USER: self.operator_token}.get(user) or self.tokens[user]
            config = {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "envtest", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": user}}],
                "current-context": "envtest",
            }
            path.write_text(yaml.safe_dump(config))
        return path

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, verify=False, headers={"Authorization": f"Bearer {self.admin_token}"}, timeout=30
        )

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """kubectl as the admin; `check` raises with kubectl's own stderr."""
        result = subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig("admin")), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def write_events(self, namespace: str | None = None) -> list[Write]:
        """Every successful write of either operator user so far (in `namespace`, or anywhere), in
        the order the API server completed them, timed by its clock."""
        writes = []
        if self.audit_log.exists():
            for line in self.audit_log.read_text().splitlines():
                event = json.loads(line)
                ref = event.get("objectRef") or {}
                if (namespace is None or ref.get("namespace") == namespace) and (key := write_key(event)):
                    user = (event.get("user") or {}).get("username", "")
                    writes.append(Write(event["stageTimestamp"], user, key, ref.get("name", "")))
        return sorted(writes, key=lambda write: write.at)

    def operator_writes(self, namespace: str | None = None) -> Counter[str]:
        """Writes the operator made so far (in `namespace`, or anywhere), as
        `resource[/subresource]:verb`; dry runs left out."""
        counts: Counter[str] = Counter()
        if not self.audit_log.exists():
            return counts
        for line in self.audit_log.read_text().splitlines():
            event = json.loads(line)
            if namespace is not None and (event.get("objectRef") or {}).get("namespace") != namespace:
                continue
            if key := write_key(event):
                counts[key] += 1
        return counts


def _write_rbac(server: ApiServer) -> None:
    """The chart's cluster-wide operator rules with its default values (Hub tokens honoured, so
    Secrets readable), bound to the operator's user."""
    rules = []
    for name in ("operator", "discovery", "secrets"):
        rules += yaml.safe_load((RBAC / f"{name}.yaml").read_text())
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": OPERATOR_USER}}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": OPERATOR_USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": OPERATOR_USER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u} for u in OPERATOR_USERS],
    }
    # The ClusterRoles the chart ships for the endpoint pickers and routers the operator deploys
    # and binds.
    bound = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": yaml.safe_load((RBAC / f"{rules_file}.yaml").read_text()),
        }
        for name, rules_file in ((PICKER_CLUSTER_ROLE, "endpoint-picker"), (ROUTER_CLUSTER_ROLE, "router"))
    ]
    documents = [{**role, "rules": rules}, binding, *bound]
    server.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(documents))


def install_crds(server: ApiServer) -> None:
    """The CRDs as shipped (`kubectl apply -f crds/`, and the chart's copy), and the stand-ins of
    add-on CRDs (testsupport/crds: the Gateway API's HTTPRoute, the Inference Extension's
    InferencePool), once Established. Before the
    operator starts: it remembers an API it found missing for a minute."""
    for crds in (*CRD_DIRS, STAND_IN_CRDS):
        server.kubectl("apply", "--server-side", "-f", str(crds))
    server.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")


@contextlib.contextmanager
def running_apiserver(work: pathlib.Path, directory: pathlib.Path, audit_reads: bool = False) -> Iterator[ApiServer]:
    """etcd and kube-apiserver on free loopback ports; stopped (and their data gone) after.
    The audit log has the operator's writes, and all its requests with `audit_reads`."""
    openssl = shutil.which("openssl")
    assert openssl, "openssl is needed for the service-account key"
    subprocess.run([openssl, "genrsa", "-out", str(work / "sa.key"), "2048"], check=True, capture_output=True)
    server = ApiServer(url="", work=work, admin_token="admin-" + os.urandom(8).hex(), operator_token="")
    server.operator_token = "operator-" + os.urandom(8).hex()
    server.tokens = {SECOND_OPERATOR_USER: "operator-" + os.urandom(8).hex()}
    users = {OPERATOR_USER: server.operator_token, **server.tokens}
    (work / "tokens.csv").write_text(
        f'{server.admin_token},admin,admin,"system:masters"\n'
        + "".join(f"{token},{user},{user}\n" for user, token in users.items())
    )
    (work / "audit-policy.yaml").write_text(yaml.safe_dump(audit_policy(audit_reads)))
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    etcd = [
        str(directory / "etcd"),
        f"--data-dir={work / 'etcd'}",
        f"--listen-client-urls={etcd_url}",
        f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
    ]
    apiserver = [
        str(directory / "kube-apiserver"),
        f"--etcd-servers={etcd_url}",
        f"--secure-port={api_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--cert-dir={work / 'certs'}",
        f"--token-auth-file={work / 'tokens.csv'}",
        "--authorization-mode=RBAC",
        f"--service-account-key-file={work / 'sa.key'}",
        f"--service-account-signing-key-file={work / 'sa.key'}",
        "--service-account-issuer=https://127.0.0.1",
        "--service-cluster-ip-range=10.0.0.0/16",  # room for the operator benchmark's 1,000 Services
        "--allow-privileged=true",
        "--disable-admission-plugins=ServiceAccount",
        f"--audit-policy-file={work / 'audit-policy.yaml'}",
        f"--audit-log-path={server.audit_log}",
        "--audit-log-format=json",
        # Never rotated: AuditTail follows one file. The default rotates it at 100 MB, which the
        # requests of 10,000 InferenceServices pass (bench/operator_scale.py).
        "--audit-log-maxsize=1000000",
    ]
    server.url = f"https://127.0.0.1:{api_port}"
    server.commands = {"etcd": (etcd, work / "etcd.log"), "kube-apiserver": (apiserver, work / "apiserver.log")}
    try:
        server.start()
        _write_rbac(server)
        yield server
    finally:
        server.stop()
