"""Per-token latency of vLLM's CPU build with and without the NixlConnector, and where its CPU goes.

A prefill/decode pair over NIXL (testsupport/pd.py) on the CPU build generates far slower than
the same tiny Llama without a connector. This measures it in one run, by phase, with at most two
vLLM processes at a time:

- `pd`: a prefill and a decode vLLM of one variant, the router in P/D mode over them; N plain
  requests (`max_tokens` tokens each, `ignore_eos`) interleaved through the router, straight to
  the prefill engine and straight to the decode engine (a role's engine answers a request without
  `kv_transfer_params` alone, as an aggregated replica does).
- `single`: one vLLM without `--kv-transfer-config` beside one with the prefill role's config of
  the variant, both idle but for the requests, which interleave.

Per target: the median seconds per generated token and its ratio to the phase's fastest target.
Per engine process group: the threads that burn CPU while the engines are idle (sampled from
/proc over a few seconds), named as the kernel names them, which tells a busy-polling thread
(UCX's progress thread, OpenMP workers spinning) from work.

A variant is the environment and connector options a role's container gets on top of the
operator's rendering (VARIANTS): `rendered` as the operator renders a CPU role, `vllm-auto-bind`
without its OpenMP variables (vLLM binding its threads itself), `no-progress-thread` a diagnostic
without NIXL's UCX progress thread. `--variants` picks them:

    .venv/bin/python bench/nixl_step_bench.py --phases pd single --variants vllm-auto-bind rendered

Needs scripts/setup-vllm.sh (with NIXL) and scripts/setup-router.sh.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from testsupport.pd import ROUTER_KV_CONNECTOR, enter_together, role_container
from testsupport.processes import free_port
from testsupport.router import VOCABULARY, PdWorkers, rendered_containers, running_router
from testsupport.vllm import build_tiny_llama, running_vllm

MODEL = "tiny"
MOUNT = "/mnt/models"
SPEC = {
    "model": {"uri": "pvc://models/tiny-llama", "name": MODEL},
    "runtime": {"engine": "vllm", "maxModelLen": 512, "args": ["--max-num-seqs=4", "--seed=0", "--block-size=32"]},
    "resources": {"gpu": {"count": 0}, "cpu": "1", "memory": "4Gi"},
    "replicas": 1,
    "routing": {"router": {"replicas": 1}},
}

# A diagnostic, not a remedy: NIXL's Python agent starts the UCX backend's shared progress
# thread with a zero delay, which polls its workers' event fds with a zero timeout, forever.
# Without it, the engine's own calls (vLLM checks its transfers and notifications every step)
# progress UCX. Put on PYTHONPATH, this makes the agent start without the thread.
NO_PROGRESS_THREAD = """
import nixl_cu12._api as api
defaults = list(api.nixl_agent_config.__init__.__defaults__)
defaults[0] = False  # enable_prog_thread
api.nixl_agent_config.__init__.__defaults__ = tuple(defaults)
"""
SITE = pathlib.Path(tempfile.gettempdir()) / f"nixl-site-{os.getpid()}"  # made and removed by main

# A variant: variables added to both roles' containers, variables taken out of them, and keys
# merged into the connector's kv_connector_extra_config. `vllm-auto-bind` is the role without
# the OpenMP variables the operator renders for it (builders/disaggregation.py:cpu_threads_env),
# as vLLM configures itself: the before of that change.
OMP_VARIABLES = ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")
WITHOUT_PROGRESS_THREAD = {"PYTHONPATH": str(SITE)}
Variant = tuple[dict[str, str], tuple[str, ...], dict[str, Any]]
VARIANTS: dict[str, Variant] = {
    "rendered": ({}, (), {}),
    "vllm-auto-bind": ({}, OMP_VARIABLES, {}),
    "no-progress-thread": (WITHOUT_PROGRESS_THREAD, (), {}),
    "vllm-auto-bind-no-progress-thread": (WITHOUT_PROGRESS_THREAD, OMP_VARIABLES, {}),
    "omp-passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, OMP_VARIABLES, {}),
    "ucx-tcp": ({"UCX_TLS": "tcp"}, OMP_VARIABLES, {}),
}


def variant_container(container: Mapping[str, Any], variant: Variant) -> dict[str, Any]:
    """`container` (a role's) with the variant's variables set and taken out, and its options
    merged into the connector's."""
    env, dropped, extra = variant
    args = []
    for arg in container["args"]:
        flag, _, value = str(arg).partition("=")
        if flag == "--kv-transfer-config" and extra:
            config = json.loads(value)
            config["kv_connector_extra_config"] = {**config.get("kv_connector_extra_config", {}), **extra}
            arg = f"{flag}={json.dumps(config, separators=(',', ':'))}"
        args.append(arg)
    kept = [var for var in container.get("env") or [] if var["name"] not in env and var["name"] not in dropped]
    return {**container, "args": args, "env": kept + [{"name": k, "value": v} for k, v in env.items()]}


def fresh(directory: pathlib.Path) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def prompt(seed: int, words: int) -> str:
    return " ".join(VOCABULARY[(seed * 31 + i * (seed % 5 + 2)) % len(VOCABULARY)] for i in range(words))


def seconds_per_token(base: str, seed: int, words: int, tokens: int) -> float:
    body = {"model": MODEL, "prompt": prompt(seed, words), "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    started = time.perf_counter()
    answer = httpx.post(f"{base}/v1/completions", json=body, timeout=900)
    elapsed = time.perf_counter() - started
    answer.raise_for_status()
    generated: int = answer.json()["usage"]["completion_tokens"]
    return elapsed / generated


def group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid:
                    pids.append(int(entry.name))
    return pids


def thread_ticks(pgid: int) -> dict[tuple[int, str], int]:
    """CPU ticks (user + system) of every thread of the process group `pgid`, by (tid, name)."""
    ticks = {}
    for pid in group_pids(pgid):
        with contextlib.suppress(OSError):
            for task in (pathlib.Path("/proc") / str(pid) / "task").iterdir():
                with contextlib.suppress(OSError):
                    text = (task / "stat").read_text()
                    name = text[text.index("(") + 1 : text.rindex(")")]
                    fields = text.rsplit(")", 1)[1].split()
                    ticks[int(task.name), name] = int(fields[11]) + int(fields[12])
    return ticks


def idle_threads(groups: Mapping[str, int], window: float = 4.0, top: int = 4) -> dict[str, list[tuple[str, float]]]:
    """Per group, its busiest threads over `window` idle seconds, as (name, % of a core)."""
    hertz = os.sysconf("SC_CLK_TCK")
    before = {name: thread_ticks(pgid) for name, pgid in groups.items()}
    time.sleep(window)
    busiest = {}
    for name, pgid in groups.items():
        after = thread_ticks(pgid)
        used = [(key[1], 100 * (after[key] - before[name].get(key, 0)) / hertz / window) for key in after]
        busiest[name] = sorted(used, key=lambda item: -item[1])[:top]
    return busiest


def measure(targets: Mapping[str, str], requests: int, words: int, tokens: int, seed: int) -> dict[str, list[float]]:
    """`requests` rounds; in each, one request to every target in turn."""
    samples: dict[str, list[float]] = {name: [] for name in targets}
    for round_ in range(requests):
        for name, base in targets.items():
            samples[name].append(seconds_per_token(base, seed + round_ * 10 + len(samples[name]), words, tokens))
    return samples


def report(title: str, samples: Mapping[str, list[float]], threads: Mapping[str, list[tuple[str, float]]]) -> None:
    medians = {name: statistics.median(values) for name, values in samples.items()}
    fastest = min(medians.values())
    print(title)
    for name, values in samples.items():
        spread = ", ".join(f"{v * 1000:.0f}" for v in values)
        print(
            f"  {name:24s} {medians[name] * 1000:8.0f} ms/token  {1 / medians[name]:6.2f} tokens/s  "
            f"x{medians[name] / fastest:5.1f}  [{spread}]"
        )
    for name, busiest in threads.items():
        print(f"  idle CPU, {name}: " + ", ".join(f"{thread} {share:.0f}%" for thread, share in busiest))


def phase_pd(
    variant: str, vllm: Mapping[str, Any], router: Mapping[str, Any], model: pathlib.Path, work: pathlib.Path, args: Any
) -> None:
    ports = {role: free_port() for role in ("prefill", "decode")}
    containers = {role: variant_container(role_container(vllm, role, free_port()), VARIANTS[variant]) for role in ports}
    with contextlib.ExitStack() as stack:
        processes = enter_together(
            stack,
            [
                running_vllm(containers[role], model, MOUNT, port, fresh(work / f"{variant}-{role}"), timeout=900)
                for role, port in ports.items()
            ],
        )
        url = {role: f"http://127.0.0.1:{port}" for role, port in ports.items()}
        router_port = free_port()
        pd = PdWorkers(prefill=[url["prefill"]], decode=[url["decode"]], kv_connector=ROUTER_KV_CONNECTOR)
        stack.enter_context(
            running_router(router, [], router_port, free_port(), fresh(work / f"{variant}-router"), pd=pd)
        )
        targets = {"router (P/D)": f"http://127.0.0.1:{router_port}", "prefill alone": url["prefill"]}
        targets["decode alone"] = url["decode"]
        measure(targets, 1, args.prompt_words, 2, 0)  # first use compiles
        threads = idle_threads({role: process.pid for role, process in zip(ports, processes, strict=True)})
        samples = measure(targets, args.requests, args.prompt_words, args.max_tokens, 100)
    report(f"pd, variant {variant}: {json.dumps(VARIANTS[variant])}", samples, threads)


def phase_single(variant: str, vllm: Mapping[str, Any], model: pathlib.Path, work: pathlib.Path, args: Any) -> None:
    env, dropped, _ = VARIANTS[variant]
    containers = {
        "no connector": variant_container(vllm, (env, dropped, {})),
        "prefill's connector": variant_container(role_container(vllm, "prefill", free_port()), VARIANTS[variant]),
    }
    ports = {name: free_port() for name in containers}
    with contextlib.ExitStack() as stack:
        processes = enter_together(
            stack,
            [
                running_vllm(containers[name], model, MOUNT, port, fresh(work / f"{variant}-{name[:2]}"), timeout=900)
                for name, port in ports.items()
            ],
        )
        targets = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        measure(targets, 1, args.prompt_words, 2, 0)
        threads = idle_threads({name: process.pid for name, process in zip(ports, processes, strict=True)})
        samples = measure(targets, args.requests, args.prompt_words, args.max_tokens, 100)
    report(f"single, variant {variant}: {json.dumps(VARIANTS[variant])}", samples, threads)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", nargs="+", choices=("pd", "single"), default=["pd", "single"])
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=["rendered"])
    parser.add_argument("--requests", type=int, default=5, help="requests per target")
    parser.add_argument("--prompt-words", type=int, default=40, help="tokens of each prompt")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--keep", type=pathlib.Path, help="keep the processes' logs in this directory")
    args = parser.parse_args(argv)
    vllm, router = rendered_containers(SPEC, MODEL, "bench")
    model = build_tiny_llama()
    SITE.mkdir()
    (SITE / "sitecustomize.py").write_text(NO_PROGRESS_THREAD)
    with tempfile.TemporaryDirectory(prefix="nixl-step-") as tmp, contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, SITE)
        work = args.keep or pathlib.Path(tmp)
        for variant in args.variants:
            for phase in args.phases:
                if phase == "pd":
                    phase_pd(variant, vllm, router, model, work, args)
                else:
                    phase_single(variant, vllm, model, work, args)


if __name__ == "__main__":
    main()
