"""The files a single-node tier cluster starts from (testsupport/nodecluster.py runs it): its
certificates, kubeconfigs, and the configuration of containerd, the CNI bridge, the kubelet and
kube-proxy, all under the cluster's work directory. The network's addresses are here too: pods on
the bridge `rio0` (10.244.0.0/24, the node and the API server at 10.244.0.1), Services in
10.96.0.0/20, no default route for pods.
"""

from __future__ import annotations

import ipaddress
import json
import pathlib
import subprocess

import yaml

from testsupport.processes import free_port

BRIDGE = "rio0"
POD_CIDR = "10.244.0.0/24"
NODE_IP = "10.244.0.1"
# Wide enough that the API server rarely gives a new Service the ClusterIP of one deleted a moment
# ago: until kube-proxy catches up, that address still leads to the old Service's pods (with a /24,
# a tier run saw a new Service's first request answered by a deleted one's terminating pod).
SERVICE_CIDR = "10.96.0.0/20"
NODE_NAME = "rio-node"
CGROUP_ROOT = "rio-tier"
PAUSE_IMAGE = "localhost/pause:rio"


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _sign(pki: pathlib.Path, name: str, subject: str, extfile: str | None = None) -> None:
    """`name`.key and `name`.crt: a new key, and its certificate signed by the tier's CA."""
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
             "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=pki)  # fmt: skip
    extensions = ["-extfile", extfile] if extfile else []
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", *extensions, "-out", f"{name}.crt", cwd=pki)  # fmt: skip


def write_pki(work: pathlib.Path) -> pathlib.Path:
    """A CA, and the API server's serving certificate for every name pods and the host use."""
    pki = work / "pki"
    pki.mkdir(exist_ok=True)
    service_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=rio-tier-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=pki)  # fmt: skip
    names = ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"]
    san = ",".join([f"DNS:{n}" for n in names] + [f"IP:{ip}" for ip in ("127.0.0.1", NODE_IP, service_ip)])
    (pki / "san.cnf").write_text(f"subjectAltName={san}\n")
    _sign(pki, "apiserver", "/CN=kube-apiserver", extfile="san.cnf")
    # The API server's client certificate for the kubelet's API (logs, exec), in system:masters.
    _sign(pki, "kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    return pki


def write_kubeconfig(path: pathlib.Path, url: str, ca: pathlib.Path, token: str) -> pathlib.Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "rio", "cluster": {"server": url, "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": {"token": token}}],
        "contexts": [{"name": "rio", "context": {"cluster": "rio", "user": "user"}}],
        "current-context": "rio",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def write_containerd_config(work: pathlib.Path, cni: pathlib.Path) -> pathlib.Path:
    run = work / "run"
    text = f"""version = 2
root = "{work / "containerd"}"
state = "{run / "containerd"}"
[grpc]
  address = "{run / "containerd.sock"}"
[ttrpc]
  address = "{run / "containerd-ttrpc.sock"}"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}"
    conf_dir = "{work / "cni"}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{work / "opt"}"
"""
    path = work / "containerd.toml"
    path.write_text(text)
    return path


def write_cni_config(work: pathlib.Path) -> None:
    (work / "cni").mkdir(exist_ok=True)
    config = {
        "cniVersion": "1.0.0",
        "name": "rio-tier",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "isDefaultGateway": False,  # no default route in pods: nothing leaves the node
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(work / "run" / "ipam"),
                    "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                    "routes": [{"dst": SERVICE_CIDR}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    (work / "cni" / "10-rio-tier.conflist").write_text(json.dumps(config))


def write_kubelet_config(work: pathlib.Path, socket: pathlib.Path, ca: pathlib.Path, healthz: int) -> pathlib.Path:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # these hosts are cgroup v1
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_ROOT}",
        "failSwapOn": False,
        "address": NODE_IP,
        "port": free_port(),
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{socket}",
        "resolvConf": "",
        "clusterDomain": "cluster.local",
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "maxPods": 60,
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "nodeStatusUpdateFrequency": "4s",
        "enableControllerAttachDetach": True,
        "localStorageCapacityIsolation": True,
        "containerLogMaxSize": "5Mi",
    }
    path = work / "kubelet.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def write_kube_proxy_config(work: pathlib.Path, kubeconfig: pathlib.Path) -> pathlib.Path:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "bindAddress": NODE_IP,
        "healthzBindAddress": f"127.0.0.1:{free_port()}",
        "metricsBindAddress": f"127.0.0.1:{free_port()}",
        "hostnameOverride": NODE_NAME,
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        # Replies from a pod behind a ClusterIP come back through the host, with or without
        # bridge netfilter, so a pod can reach a Service on its own bridge.
        "iptables": {"masqueradeAll": True, "syncPeriod": "5s", "minSyncPeriod": "0s"},
        "conntrack": {"maxPerCore": 0},
        "nodePortAddresses": [f"{NODE_IP}/32"],
    }
    path = work / "kube-proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
