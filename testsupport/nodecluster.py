"""A real single-node cluster on this machine, as root: containerd and runc, etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, a kubelet and kube-proxy, with pods on a local bridge.

The Kubernetes binaries come from `$KUBEBUILDER_ASSETS` (or envtest's /usr/local/kubebuilder/bin),
as in the real-apiserver tier; containerd, runc, the CNI plugins, podman, iptables and busybox-static
from Debian (`scripts/setup.sh` installs them). Where anything is missing the tier is skipped with
`SKIP_REASON`.

Network: pods live on the bridge `rio0` (10.244.0.0/24, the bridge's 10.244.0.1 is the node's
address and the API server's); they get no default route and no NAT to the outside; the host
forwards only from the bridge back to the bridge (a FORWARD rule of ours comes first), which is
what Service ClusterIPs need. Every image is `localhost/...` and preloaded: nothing is pulled.

Everything the tier creates is written down in `<work>/state.json` as it is created, so that
`teardown(work)` removes it all, from this process or from another after this one was killed:
processes (by PID, checked against their command line), container shims and container processes
(by the cgroups under `CGROUP_ROOT`), mounts under the work directory and the image store
(testsupport.imagestore), network namespaces, the bridge, iptables chains, and the sysctls the
kubelet changes (restored).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from testsupport import imagestore
from testsupport.envtest import ASSETS_ENV, DEFAULT_ASSETS, ApiServer
from testsupport.node_config import (
    BRIDGE,
    CGROUP_ROOT,
    NODE_IP,
    NODE_NAME,
    PAUSE_IMAGE,
    POD_CIDR,
    SERVICE_CIDR,
    write_cni_config,
    write_containerd_config,
    write_kube_proxy_config,
    write_kubeconfig,
    write_kubelet_config,
    write_pki,
)
from testsupport.processes import free_port
from testsupport.waiting import NeverHappened, eventually

CGROUP_BASE = pathlib.Path("/sys/fs/cgroup")
NETNS_DIR = pathlib.Path("/var/run/netns")
FORWARD_CHAIN = "RIO-TIER-FORWARD"
# What the kubelet (and the tier's forwarding) change on the host; restored at teardown.
SYSCTLS = (
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
    "net/ipv4/ip_forward",
    "net/bridge/bridge-nf-call-iptables",
)
BINARIES = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy")
HOST_TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "podman", "iptables", "ip", "openssl", "kubectl")
CNI_DIRS = (pathlib.Path("/usr/lib/cni"), pathlib.Path("/opt/cni/bin"))
BUSYBOX = pathlib.Path("/bin/busybox")


def assets() -> pathlib.Path:
    return pathlib.Path(os.environ.get(ASSETS_ENV) or DEFAULT_ASSETS)


def cni_dir() -> pathlib.Path | None:
    return next((d for d in CNI_DIRS if (d / "bridge").is_file() and (d / "host-local").is_file()), None)


def missing() -> str | None:
    """Why the tier cannot run on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "not root"
    lacking = [name for name in BINARIES if not (assets() / name).is_file()]
    lacking += [tool for tool in HOST_TOOLS if shutil.which(tool) is None]
    if cni_dir() is None:
        lacking.append("CNI bridge/host-local plugins")
    if not BUSYBOX.is_file():
        lacking.append("busybox-static")
    if not (CGROUP_BASE / "memory").is_dir() and not (CGROUP_BASE / "cgroup.controllers").is_file():
        lacking.append("cgroups")
    return f"missing {', '.join(lacking)}" if lacking else None


SKIP_REASON = (
    "real-pods tier: needs root, the Kubernetes node binaries in $KUBEBUILDER_ASSETS or /usr/local/kubebuilder/bin "
    "and containerd/runc/CNI/podman/iptables/busybox-static (scripts/setup.sh); see tests/tiers/pods.md"
)


# --------------------------------------------------------------------------- state and teardown


class State:
    """What the tier created, on disk as soon as it exists, for `teardown` to undo."""

    def __init__(self, work: pathlib.Path):
        self.path = work / "state.json"
        self.lock = threading.Lock()  # the images are brought in from a thread of their own
        self.data: dict[str, Any] = {"work": str(work), "pids": [], "sysctls": {}, "netns_before": [], "chains": []}
        if self.path.exists():
            self.data = json.loads(self.path.read_text())

    def save(self) -> None:
        with self.lock:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data))
            tmp.replace(self.path)

    def add_pid(self, pid: int, marker: str) -> None:
        with self.lock:
            self.data["pids"].append([pid, marker])
        self.save()


def _alive(pid: int, marker: str) -> bool:
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return marker in cmdline


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_gone(check: Any, seconds: float) -> bool:
    try:
        return eventually(lambda: not check(), timeout=seconds, interval=0.1, what="gone")
    except NeverHappened:
        return False


def _cgroup_dirs() -> list[pathlib.Path]:
    """Every directory of the tier's cgroup tree in every hierarchy, deepest first."""
    dirs: list[pathlib.Path] = []
    for hierarchy in CGROUP_BASE.iterdir():
        root = hierarchy / CGROUP_ROOT
        if root.is_dir():
            dirs += [pathlib.Path(d) for d, _, _ in os.walk(root)]
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def _cgroup_pids() -> list[int]:
    pids: set[int] = set()
    for directory in _cgroup_dirs():
        with contextlib.suppress(OSError):
            pids |= {int(p) for p in (directory / "cgroup.procs").read_text().split()}
    return sorted(pids)


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                    found.append(int(entry.name))
    return found


def _mounts_under(path: pathlib.Path) -> list[str]:
    mounts = []
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(path) or point.startswith(str(path) + "/"):
            mounts.append(point)
    return sorted(set(mounts), key=len, reverse=True)


def _iptables_chains(binary: str, table: str) -> list[str]:
    done = subprocess.run([binary, "-t", table, "-S"], capture_output=True, text=True, check=False)
    return [line.split()[1] for line in done.stdout.splitlines() if line.startswith("-N ")]


def _run(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=60)


def _tier_netns(before: set[str]) -> list[pathlib.Path]:
    """The network namespaces CRI made for the tier's pods (containerd 1.6 puts them in /var/run/netns)."""
    if not NETNS_DIR.is_dir():
        return []
    return [n for n in NETNS_DIR.iterdir() if n.name.startswith("cni-") and n.name not in before]


def _tier_chains() -> Iterator[tuple[str, str, list[str]]]:
    """(binary, table, chains) per iptables table: the chains kube-proxy and the tier made in it."""
    for binary in ("iptables", "ip6tables"):
        if shutil.which(binary) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            yield binary, table, [c for c in _iptables_chains(binary, table) if c.startswith(("KUBE-", "RIO-"))]


def _unrestored_sysctls(state: State) -> list[str]:
    found = []
    for key, value in state.data["sysctls"].items():
        with contextlib.suppress(OSError):
            if (pathlib.Path("/proc/sys") / key).read_text().strip() != value:
                found.append(f"sysctl {key} not restored")
    return found


def leftovers(work: pathlib.Path) -> list[str]:
    """What of the tier is still on this machine: empty after a complete teardown."""
    state = State(work) if (work / "state.json").exists() else None
    recorded = state.data["pids"] if state else []
    found = [f"process {pid} ({marker})" for pid, marker in recorded if _alive(pid, marker)]
    found += [f"process {pid} mentioning {work}" for pid in _processes_mentioning(str(work))]
    found += [f"mount {m}" for m in _mounts_under(work) + _mounts_under(imagestore.STORE)]
    found += [f"cgroup {d}" for d in _cgroup_dirs()]
    if pathlib.Path(f"/sys/class/net/{BRIDGE}").exists():
        found.append(f"bridge {BRIDGE}")
    found += [f"netns {n.name}" for n in _tier_netns(set(state.data["netns_before"]) if state else set())]
    found += [f"{binary} {table} {c}" for binary, table, chains in _tier_chains() for c in chains]
    return found + (_unrestored_sysctls(state) if state else [])


def teardown(work: pathlib.Path, seconds: dict[str, float] | None = None) -> None:
    """Remove everything the tier made under `work` and on the host; safe to call twice, and from
    another process after the one that started the tier was killed. `seconds` gets each step's time."""
    state = State(work)
    clock = [time.monotonic()]

    def done(step: str) -> None:
        now = time.monotonic()
        if seconds is not None:
            seconds[f"teardown: {step}"] = now - clock[0]
        clock[0] = now

    _stop_recorded(state)
    _kill_containers(work)
    done("processes and containers killed")
    for netns in _tier_netns(set(state.data["netns_before"])):
        _run("umount", str(netns))
        with contextlib.suppress(OSError):
            netns.unlink()
    for point in _mounts_under(work) + _mounts_under(imagestore.STORE):
        if _run("umount", point).returncode != 0:
            _run("umount", "-l", point)
    done("network namespaces and mounts removed")
    for directory in _cgroup_dirs():
        with contextlib.suppress(OSError):
            directory.rmdir()
    _run("ip", "link", "delete", BRIDGE)
    for binary, table, ours in _tier_chains():
        _remove_chains(binary, table, ours)
    done("cgroups, bridge and iptables chains removed")
    for key, value in state.data["sysctls"].items():
        with contextlib.suppress(OSError):
            (pathlib.Path("/proc/sys") / key).write_text(value)
    shutil.rmtree(work / "run", ignore_errors=True)


def _stop_recorded(state: State) -> None:
    """Control plane, kubelet, kube-proxy and containerd, by PID, killed: their data is removed
    next, so a graceful stop buys nothing (and kube-apiserver took over 10 s to end on SIGTERM)."""
    recorded = [(pid, marker) for pid, marker in state.data["pids"] if _alive(pid, marker)]
    _kill([pid for pid, _ in reversed(recorded)], signal.SIGKILL)
    _wait_gone(lambda: any(_alive(p, m) for p, m in recorded), 10)  # what outlives it, leftovers() names


def _kill_containers(work: pathlib.Path) -> None:
    """Shims (they name the containerd socket under `work`) and every container process."""
    for _ in range(3):
        victims = _processes_mentioning(str(work)) + _cgroup_pids()
        if not victims:
            break
        _kill(victims, signal.SIGKILL)
        _wait_gone(lambda: bool(_processes_mentioning(str(work)) + _cgroup_pids()), 5)


def _remove_chains(binary: str, table: str, ours: list[str]) -> None:
    """Rules in built-in chains that jump to ours go first, then our chains themselves."""
    if not ours:
        return
    rules = _run(binary, "-t", table, "-S").stdout.splitlines()
    for rule in rules:
        parts = shlex.split(rule)
        if parts[0] == "-A" and parts[1] not in ours and any(c in parts for c in ours):
            _run(binary, "-t", table, "-D", *parts[1:])
    for chain in ours:
        _run(binary, "-t", table, "-F", chain)
    for chain in ours:
        _run(binary, "-t", table, "-X", chain)


# --------------------------------------------------------------------------- the cluster


@dataclasses.dataclass
class NodeCluster(ApiServer):
    """The API server of a cluster with a node: kubectl as admin, and the node's runtime."""

    containerd_socket: pathlib.Path = pathlib.Path()
    started: float = 0.0  # time.monotonic() when the tier began to start
    # Putting the images into the node's containerd: the image store brought up to date (only an
    # image it lacks is imported: the vLLM image's 2.7 GB took 51-93 s) and its copy linked in.
    import_seconds: float = 0.0
    imported: list[str] = dataclasses.field(default_factory=list)  # the images the store lacked
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # start-up steps, seconds

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=600,
        )


def _set_sysctl(state: State, key: str, value: str) -> None:
    path = pathlib.Path("/proc/sys") / key
    if not path.exists():
        return
    state.data["sysctls"].setdefault(key, path.read_text().strip())
    state.save()
    path.write_text(value)


def _network(state: State) -> None:
    """The bridge with the node's address, forwarding only from the bridge to the bridge."""
    _run("ip", "link", "add", BRIDGE, "type", "bridge", check=True)
    _run("ip", "addr", "add", f"{NODE_IP}/{POD_CIDR.split('/')[1]}", "dev", BRIDGE, check=True)
    _run("ip", "link", "set", BRIDGE, "up", check=True)
    # The host's packets to a ClusterIP kube-proxy has not programmed yet (a Service created a
    # moment ago) stay on the bridge instead of following the default route off the machine;
    # the route goes with the bridge.
    _run("ip", "route", "add", SERVICE_CIDR, "dev", BRIDGE, check=True)
    _run("iptables", "-N", FORWARD_CHAIN, check=True)
    for rule in (
        ["-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"],
        ["-i", BRIDGE, "-j", "DROP"],
        ["-o", BRIDGE, "-j", "DROP"],
    ):
        _run("iptables", "-A", FORWARD_CHAIN, *rule, check=True)
    _run("iptables", "-I", "FORWARD", "1", "-j", FORWARD_CHAIN, check=True)
    # Kernel tunables the kubelet sets on start (saved first, so teardown restores them).
    for key in SYSCTLS[:3]:
        _set_sysctl(state, key, (pathlib.Path("/proc/sys") / key).read_text().strip())
    _set_sysctl(state, "net/bridge/bridge-nf-call-iptables", "1")
    _set_sysctl(state, "net/ipv4/ip_forward", "1")


def _cgroups() -> None:
    for hierarchy in CGROUP_BASE.iterdir():
        if hierarchy.is_dir() and not hierarchy.is_symlink() and (hierarchy / "cgroup.procs").exists():
            (hierarchy / CGROUP_ROOT).mkdir(exist_ok=True)
    cpuset = CGROUP_BASE / "cpuset" / CGROUP_ROOT
    if cpuset.is_dir():  # a v1 cpuset child starts empty: it inherits nothing by itself
        for name in ("cpuset.cpus", "cpuset.mems"):
            (cpuset / name).write_text((CGROUP_BASE / "cpuset" / name).read_text())


def _start(
    stack: contextlib.ExitStack, state: State, work: pathlib.Path, name: str, args: list[str]
) -> subprocess.Popen[bytes]:
    log = stack.enter_context((work / f"{name}.log").open("ab"))
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    state.add_pid(process.pid, args[0])
    return process


def _wait(what: str, check: Any, seconds: float, processes: list[subprocess.Popen[bytes]], work: pathlib.Path) -> None:

    def done() -> bool:
        for process in processes:
            if process.poll() is not None:
                name = pathlib.Path(str(process.args[0])).name  # type: ignore[index]
                log = work / f"{name}.log"
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise AssertionError(f"{name} exited ({process.returncode}) while waiting for {what}:\n{tail}")
        with contextlib.suppress(Exception):
            return bool(check())
        return False

    eventually(done, timeout=seconds, interval=0.25, what=what)


def _pause_image(work: pathlib.Path) -> str:
    """A pause image from busybox-static: the sandbox process that holds a pod's namespaces
    (podman's layer cache keeps its ID, so the image store keeps it too)."""
    context = work / "pause"
    context.mkdir(exist_ok=True)
    shutil.copy(BUSYBOX, context / "busybox")
    (context / "Containerfile").write_text(
        "FROM scratch\nCOPY busybox /bin/busybox\nUSER 65535:65535\n"
        'ENTRYPOINT ["/bin/busybox", "sleep", "2147483647"]\n'
    )
    build_image(context / "Containerfile", context, PAUSE_IMAGE)
    return PAUSE_IMAGE


def build_image(dockerfile: pathlib.Path, context: pathlib.Path, tag: str, *extra: str) -> None:
    """podman build, offline and pulling nothing (every FROM is a local image)."""
    done = subprocess.run(
        [
            "podman",
            "build",
            "--format",
            "docker",
            "--pull=never",
            "--network=none",
            "-q",
            "-f",
            str(dockerfile),
            "-t",
            tag,
            *extra,
            str(context),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    assert done.returncode == 0, f"podman build {tag} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


@contextlib.contextmanager
def running_cluster(work: pathlib.Path, images: Sequence[str] = ()) -> Iterator[NodeCluster]:
    """A cluster with one Ready node running pods; `images` (names podman has) are in its
    containerd before the kubelet starts, from the machine's image store (testsupport.imagestore).
    Everything is removed after, even on error."""
    teardown(work)  # a previous run of the tier that was killed half-way
    leftover = [item for item in leftovers(work) if not item.startswith("sysctl")]
    assert not leftover, f"the tier cannot start over what is left of another run: {leftover}"
    shutil.rmtree(work, ignore_errors=True)  # a new cluster: etcd, containerd and kubelet start empty
    work.mkdir(parents=True)
    state = State(work)
    state.data["netns_before"] = sorted(n.name for n in NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else []
    state.save()
    directory = assets()
    cni = cni_dir()
    assert cni is not None
    started = time.monotonic()
    cluster: NodeCluster | None = None
    try:
        with contextlib.ExitStack() as stack:
            cluster = _bring_up(stack, state, work, directory, cni, images)
            cluster.started = started
            yield cluster
    finally:
        teardown(work, cluster.phases if cluster is not None else None)


def _images_in_root(state: State, work: pathlib.Path, images: Sequence[str]) -> tuple[float, list[str]]:
    """The pause image and `images` in a containerd root at `work/containerd`, from the image
    store (brought up to date first); the seconds it took and the images the store lacked."""
    started = time.monotonic()
    names = [_pause_image(work), *images]
    with imagestore.locked(imagestore.STORE):
        imported = imagestore.sync(imagestore.STORE, names, work / "run" / "store", state.add_pid)
        imagestore.seed(imagestore.STORE, work / "containerd")
    return time.monotonic() - started, imported


def _bring_up(
    stack: contextlib.ExitStack,
    state: State,
    work: pathlib.Path,
    directory: pathlib.Path,
    cni: pathlib.Path,
    images: Sequence[str],
) -> NodeCluster:
    run = work / "run"
    run.mkdir(exist_ok=True)
    _network(state)
    _cgroups()
    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="images") as pool:
        # The images reach containerd's root while the control plane starts; leaving this block
        # waits for them even when the control plane fails, so teardown never races an import.
        loading = pool.submit(_images_in_root, state, work, images)
        cluster, processes = _control_plane(stack, state, work, directory)
        cluster.phases["control plane"] = time.monotonic() - began
        cluster.import_seconds, cluster.imported = loading.result()
    cluster.phases["images in containerd's root"] = cluster.import_seconds
    waited = time.monotonic()

    def start(name: str, *args: str) -> None:
        processes.append(_start(stack, state, work, name, list(args)))

    start("containerd", "containerd", "--config", str(write_containerd_config(work, cni)))
    write_cni_config(work)
    _wait("containerd", lambda: cluster.ctr("version").returncode == 0, 30, processes, work)
    pki = work / "pki"
    start(
        "kubelet",
        str(directory / "kubelet"),
        f"--config={write_kubelet_config(work, run / 'containerd.sock', pki / 'ca.crt', free_port())}",
        f"--kubeconfig={cluster.kubeconfig('node')}",
        f"--root-dir={work / 'kubelet'}",
        f"--cert-dir={work / 'kubelet-pki'}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={NODE_IP}",
        "--v=1",
    )
    start(
        "kube-proxy",
        str(directory / "kube-proxy"),
        f"--config={write_kube_proxy_config(work, cluster.kubeconfig('proxy'))}",
    )
    _wait("the node to be Ready", lambda: _node_ready(cluster), 120, processes, work)
    _wait(
        "the default ServiceAccount",
        lambda: cluster.kubectl("get", "sa", "default", check=False).returncode == 0,
        60,
        processes,
        work,
    )
    cluster.phases["containerd, kubelet and kube-proxy to a Ready node"] = time.monotonic() - waited
    stack.pop_all()  # log files stay open for the processes; teardown stops them by PID
    return cluster


def _control_plane(
    stack: contextlib.ExitStack, state: State, work: pathlib.Path, directory: pathlib.Path
) -> tuple[NodeCluster, list[subprocess.Popen[bytes]]]:
    """Certificates, tokens, etcd, kube-apiserver (answering /readyz), the controller manager
    and the scheduler; the cluster and the processes started."""
    pki = write_pki(work)
    tokens = {user: f"{user}-{os.urandom(8).hex()}" for user in ("admin", "node", "controller", "scheduler", "proxy")}
    (work / "tokens.csv").write_text(
        f'{tokens["admin"]},admin,admin,"system:masters"\n'
        f'{tokens["node"]},system:node:{NODE_NAME},node,"system:nodes"\n'
        f'{tokens["controller"]},system:kube-controller-manager,controller,"system:masters"\n'
        f"{tokens['scheduler']},system:kube-scheduler,scheduler\n"
        f"{tokens['proxy']},system:kube-proxy,proxy\n"
    )
    api_port = free_port()
    url = f"https://{NODE_IP}:{api_port}"
    kubeconfigs = {
        user: write_kubeconfig(work / f"kubeconfig-{user}.yaml", url, pki / "ca.crt", t) for user, t in tokens.items()
    }
    cluster = NodeCluster(
        url=url,
        work=work,
        admin_token=tokens["admin"],
        operator_token="",
        containerd_socket=work / "run" / "containerd.sock",
    )
    processes: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> None:
        processes.append(_start(stack, state, work, name, list(args)))

    etcd_port, peer_port = free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    start(
        "etcd",
        str(directory / "etcd"),
        f"--data-dir={work / 'etcd'}",
        f"--listen-client-urls={etcd_url}",
        f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
    )
    start(
        "kube-apiserver",
        str(directory / "kube-apiserver"),
        f"--etcd-servers={etcd_url}",
        f"--secure-port={api_port}",
        f"--bind-address={NODE_IP}",
        f"--advertise-address={NODE_IP}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={work / 'tokens.csv'}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        f"--service-account-key-file={pki / 'sa.key'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=false",
        # The node by its address: its name is in no DNS.
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'kubelet-client.key'}",
        "--profiling=false",
    )
    with cluster.client() as client:
        _wait("kube-apiserver", lambda: client.get("/readyz").status_code == 200, 120, processes, work)
    start(
        "kube-controller-manager",
        str(directory / "kube-controller-manager"),
        f"--kubeconfig={kubeconfigs['controller']}",
        "--bind-address=127.0.0.1",
        f"--secure-port={free_port()}",
        "--leader-elect=false",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        "--use-service-account-credentials=false",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller",
        "--concurrent-gc-syncs=5",
        "--node-monitor-grace-period=40s",
        "--profiling=false",
    )
    start(
        "kube-scheduler",
        str(directory / "kube-scheduler"),
        f"--kubeconfig={kubeconfigs['scheduler']}",
        "--bind-address=127.0.0.1",
        f"--secure-port={free_port()}",
        "--leader-elect=false",
        "--profiling=false",
    )
    return cluster, processes


def _node_ready(cluster: NodeCluster) -> bool:
    done = cluster.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
    if done.returncode != 0:
        return False
    conditions = json.loads(done.stdout)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def http_get(url: str, timeout: float = 5) -> httpx.Response:
    return httpx.get(url, timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    """`python -m testsupport.nodecluster up DIR`: a cluster to look at by hand (its admin
    kubeconfig is printed), with a pod running, until SIGINT/SIGTERM; `down DIR` removes what a
    killed `up` left behind."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m testsupport.nodecluster")
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("work", type=pathlib.Path)
    args = parser.parse_args(argv)
    if args.command == "down":
        teardown(args.work)
        print("\n".join(leftovers(args.work)) or "nothing left")
        return 0
    if reason := missing():
        print(f"{SKIP_REASON} ({reason})")
        return 2
    stop = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with running_cluster(args.work) as cluster:
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "pause", "namespace": "default"},
                "spec": {"containers": [{"name": "pause", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}]},
            }
            cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
            cluster.kubectl("wait", "--for=condition=Ready", "pod/pause", "--timeout=120s")
            print(f"KUBECONFIG={cluster.kubeconfig('admin')}", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, stop)


if __name__ == "__main__":
    raise SystemExit(main())
