"""The whole path on one laptop: kubectl apply → operator → Deployment → model server → answer.

No cluster is needed: the operator runs for real (its own process) against an emulated
Kubernetes API on 127.0.0.1, and the model server runs for real on the CPU with the exact
arguments the operator put into the Deployment. Only the kubelet's part is played here:
starting the container and reporting it ready.
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile

import httpx
import numpy as np
import yaml

from testsupport.cluster import DEPLOYMENTS, condition, running_cluster, wait_for
from testsupport.onnx_models import affine_model
from testsupport.processes import free_port, running

ROOT = pathlib.Path(__file__).resolve().parent.parent

EXAMPLE = ROOT / "examples" / "resnet-2gpu.yaml"


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def print_table(cr: dict) -> None:
    """`kubectl get ris` from the CRD's printer columns."""
    status = cr.get("status") or {}
    ready = (condition(cr, "Ready") or {}).get("status", "")
    gpus = cr["spec"].get("resources", {}).get("gpu", {}).get("count", "")
    latency = (status.get("autoscaler") or {}).get("latencyP95Ms", "")
    rows = [
        ("NAME", "READY", "REPLICAS", "GPUS", "LATENCY", "URL"),
        (
            cr["metadata"]["name"],
            ready,
            str(status.get("replicas", "")),
            str(gpus),
            str(latency),
            status.get("url", ""),
        ),
    ]
    widths = [max(len(r[i]) for r in rows) + 3 for i in range(len(rows[0]))]
    for row in rows:
        print("".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = pathlib.Path(tmp_name)
        with running_cluster(tmp) as cluster:
            env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
            env.pop("KUBERNETES_SERVICE_HOST", None)
            say(f"Emulated Kubernetes API on {cluster.url}; starting the operator")
            with running(
                [sys.executable, "-m", "inference_operator", "run", "--all-namespaces"],
                env=env,
                log=tmp / "operator.log",
                stop_timeout=20,
            ):
                return run_demo(cluster, env, tmp)


def run_demo(cluster, env: dict, tmp: pathlib.Path) -> int:
    cr = yaml.safe_load(EXAMPLE.read_text())
    name, namespace = cr["metadata"]["name"], cr["metadata"]["namespace"]
    say(f"kubectl apply -f {EXAMPLE.relative_to(ROOT)}")
    response = cluster.apply_cr(cr)
    response.raise_for_status()

    deployment = wait_for(
        lambda: cluster.get(DEPLOYMENTS, namespace, name), timeout=60, message="the operator to create the Deployment"
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    say("The operator created Deployment and Service; the GPU wiring of the pod:")
    print(
        yaml.safe_dump(
            {
                "resources": container["resources"],
                "env": container["env"],
                "affinity": deployment["spec"]["template"]["spec"].get("affinity"),
                "tolerations": deployment["spec"]["template"]["spec"].get("tolerations"),
            },
            sort_keys=False,
        )
    )
    print("args:", " ".join(container["args"]))

    say("Playing the kubelet: starting the model server with the Deployment's own arguments (CPU)")
    models = tmp / "models"
    rng = np.random.default_rng(0)
    weights, bias = rng.standard_normal((4, 3)).astype(np.float32), np.zeros(3, np.float32)
    affine_model(models / cr["spec"]["model"].get("version", "1") / "model.onnx", weights, bias)
    port, metrics_port = free_port(), free_port()
    args = list(container["args"])
    args[args.index("--model") + 1] = str(models)
    args[args.index("--port") + 1] = str(port)
    args[args.index("--metrics-port") + 1] = str(metrics_port)
    server_env = {**env, **{e["name"]: e["value"] for e in container["env"]}}
    base = f"http://127.0.0.1:{port}"
    with running(
        [sys.executable, "-m", "model_server", *args, "--host", "127.0.0.1"],
        env=server_env,
        log=tmp / "server.log",
        ready_url=base + "/health/ready",
        stop_timeout=20,
    ):
        cluster.complete_rollout(namespace, name, replicas=1)
        wait_for(
            lambda: (condition(cluster.get_cr(namespace, name), "Ready") or {}).get("status") == "True",
            timeout=30,
            message="Ready=True",
        )
        say("kubectl get ris -n ml")
        print_table(cluster.get_cr(namespace, name))

        row = [0.5, -1.0, 2.0, 0.25]
        say(f"POST /infer {row}")
        answer = httpx.post(base + "/infer", json={"data": row}, timeout=10).json()
        print(answer)
        expected = np.array(row, dtype=np.float32) @ weights + bias
        got = np.array(answer["result"], dtype=np.float32).reshape(-1)
        print("matches numpy:", bool(np.allclose(got, expected, atol=1e-5)))

        say(f"POST /v2/models/{name}/infer (Open Inference Protocol)")
        v2 = httpx.post(
            f"{base}/v2/models/{name}/infer",
            timeout=10,
            json={"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": row + row}]},
        ).json()
        print(v2)

        say("A few of the server's metrics (what the autoscaler reads through Prometheus)")
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        for line in metrics.splitlines():
            if line.startswith(("model_server_requests_total", "model_server_request_duration_seconds_count")):
                print(line)
        return 0 if np.allclose(got, expected, atol=1e-5) else 1


if __name__ == "__main__":
    sys.exit(main())
