"""Model repository: discovery, version policy, hot reload and draining."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from model_server.discovery import discover, select_versions, version_key
from model_server.errors import ModelNotFound, ModelNotReady
from model_server.metrics import ServerMetrics
from model_server.repository import ModelRepository
from testsupport.onnx_models import scale_model
from testsupport.waiting import eventually_async

from .helpers import HeldRuntime, make_settings, running_server, until


def test_discover_layouts(tmp_path):
    repo = tmp_path / "repo"
    for version in ("1", "2", "10", "beta"):
        scale_model(repo / version / "model.onnx", 1.0)
    (repo / ".tmp-copy").mkdir()
    scale_model(repo / ".tmp-copy" / "model.onnx", 1.0)
    (repo / "3").mkdir()  # a version directory without a model yet
    found = discover(repo, "auto")
    assert sorted(found, key=version_key) == ["1", "2", "10", "beta"]
    assert found["10"].path == repo / "10" / "model.onnx"
    assert list(select_versions(found, 2)) == ["beta", "10"]
    assert sorted(select_versions(found, 0)) == sorted(found)
    assert max(["9", "10", "2"], key=version_key) == "10"

    single = scale_model(tmp_path / "plain" / "resnet.onnx", 1.0)
    assert discover(single, "auto")["1"].path == single
    assert discover(single.parent, "onnx")["1"].path == single
    assert discover(tmp_path / "nothing", "auto") == {}


def test_fingerprint_changes_when_files_change(tmp_path):
    path = scale_model(tmp_path / "repo" / "1" / "model.onnx", 1.0)
    before = discover(tmp_path / "repo", "onnx")["1"].fingerprint
    scale_model(path, 2.0, width=6)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    assert discover(tmp_path / "repo", "onnx")["1"].fingerprint != before


def repository(repo: Path, **overrides) -> ModelRepository:
    return ModelRepository(make_settings(repo, **overrides), ServerMetrics(CollectorRegistry()))


async def infer(repo: ModelRepository, value: float, version: str | None = None) -> tuple[str, float]:
    served = repo.resolve(version)
    out = await served.batcher.submit({"x": np.full((1, 4), value, np.float32)}, 1)
    return served.version, float(out["y"][0, 0])


async def test_replaced_version_drains_its_queue_before_release(tmp_path):
    scale_model(tmp_path / "repo" / "1" / "model.onnx", 1.0)
    held = HeldRuntime()
    settings = make_settings(tmp_path / "repo", max_versions=1, max_delay_ms=10_000, max_batch_size=64)
    repo = ModelRepository(settings, ServerMetrics(CollectorRegistry()), backend_factory=held)
    await repo.sync()
    queued = [asyncio.ensure_future(infer(repo, 1))]
    await until(lambda: held.held == 1)  # the runtime is busy with the first request
    queued += [asyncio.ensure_future(infer(repo, v)) for v in (2, 3)]
    await asyncio.sleep(0.01)
    old = repo.served["1"]
    assert old.batcher.depth == 2  # forming behind the busy runtime

    scale_model(tmp_path / "repo" / "2" / "model.onnx", 2.0)
    await repo.sync()
    assert list(repo.served) == ["2"] and old.batcher.closing
    held.release()
    assert await infer(repo, 5) == ("2", 10.0)
    assert await asyncio.gather(*queued) == [("1", 1.0), ("1", 2.0), ("1", 3.0)]
    with pytest.raises(ModelNotFound, match="on disk but not served"):
        repo.resolve("1")
    await repo.stop(1)


async def test_model_fault_bad_new_version_keeps_the_old_one_serving(tmp_path):
    scale_model(tmp_path / "repo" / "1" / "model.onnx", 1.0)
    repo = repository(tmp_path / "repo", max_versions=1)
    await repo.sync()
    (tmp_path / "repo" / "2").mkdir()
    (tmp_path / "repo" / "2" / "model.onnx").write_bytes(b"truncated")
    await repo.sync()
    assert list(repo.served) == ["1"] and repo.not_ready_reason() is None
    assert "cannot load ONNX model" in repo.failures["2"]
    assert await infer(repo, 3) == ("1", 3.0)
    with pytest.raises(ModelNotReady, match="version 2 failed to load"):
        repo.resolve("2")
    # Fixing the files (new fingerprint) retries the version.
    scale_model(tmp_path / "repo" / "2" / "model.onnx", 2.0)
    await repo.sync()
    assert list(repo.served) == ["2"] and repo.failures == {}
    await repo.stop(1)


async def test_in_place_rewrite_reloads_the_same_version(tmp_path):
    path = scale_model(tmp_path / "m.onnx", 1.0)
    repo = repository(path)
    await repo.sync()
    assert await infer(repo, 2) == ("1", 2.0)
    scale_model(path, 3.0)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    await repo.sync()
    assert await infer(repo, 2) == ("1", 6.0)
    await repo.stop(1)


async def test_emptied_repository_keeps_serving_the_last_version(tmp_path):
    scale_model(tmp_path / "repo" / "1" / "model.onnx", 1.0)
    repo = repository(tmp_path / "repo")
    await repo.sync()
    shutil.rmtree(tmp_path / "repo")
    await repo.sync()
    assert list(repo.served) == ["1"] and await infer(repo, 4) == ("1", 4.0)
    await repo.stop(1)


@pytest.mark.slow
async def test_hot_reload_over_http_without_failed_requests(tmp_path):
    repo = tmp_path / "repo"
    scale_model(repo / "1" / "model.onnx", 1.0)
    settings = make_settings(repo, watch=True, watch_debounce_ms=100, max_versions=2)
    results: list[tuple[int, str, float, float]] = []

    async def client_loop(client, stop, worker):
        i = 0
        while not stop.is_set():
            i += 1
            value = float(worker * 1000 + i)
            r = await client.post("/infer", json={"data": [value, 0, 0, 0]})
            body = r.json()
            results.append((r.status_code, body.get("model_version"), value, (body.get("result") or [None])[0]))

    async def wait_for(predicate, timeout=20.0):
        await eventually_async(predicate, timeout=timeout)

    with running_server(settings) as running:
        repository_ = running.state.repository
        async with httpx.AsyncClient(base_url=running.url) as client:
            stop = asyncio.Event()
            loops = [asyncio.ensure_future(client_loop(client, stop, w)) for w in range(3)]
            await wait_for(lambda: len(results) >= 10)
            # Publish version 2 the way a copy job would: into a hidden dir, then rename.
            scale_model(repo / ".incoming" / "model.onnx", 2.0)
            (repo / ".incoming").rename(repo / "2")
            await wait_for(lambda: any(v == "2" for _, v, _, _ in results[-3:]))
            # A broken version 3 must not disturb version 2.
            (repo / "3").mkdir()
            (repo / "3" / "model.onnx").write_bytes(b"\x08\x01broken")
            await wait_for(lambda: "3" in repository_.failures)
            mark = len(results)
            await wait_for(lambda: len(results) >= mark + 10)
            stop.set()
            await asyncio.gather(*loops)
            ready = (await client.get("/health/ready")).json()
            explicit = (await client.post("/infer", json={"data": [1, 0, 0, 0], "model_version": "1"})).json()

    assert [r for r in results if r[0] != 200] == []
    factor = {"1": 1.0, "2": 2.0}
    for _, version, value, result in results:
        assert result == pytest.approx(value * factor[version])
    assert {v for _, v, _, _ in results[mark:]} == {"2"}
    assert ready["ready"] is True and ready["latest"] == "2" and "3" in ready["failed"]
    assert explicit["model_version"] == "1" and explicit["result"][0] == 1.0


async def test_batch_buckets_shape_warmup_and_requests(tmp_path):
    from model_server.backends.onnx import OnnxBackend

    seen: list[int] = []

    class Recording(OnnxBackend):
        def infer(self, inputs):
            seen.append(inputs["x"].shape[0])
            return super().infer(inputs)

    scale_model(tmp_path / "repo" / "1" / "model.onnx", 1.0)
    settings = make_settings(tmp_path / "repo", batch_buckets="2,4", max_batch_size=4)
    repo = ModelRepository(
        settings,
        ServerMetrics(CollectorRegistry()),
        backend_factory=lambda path, s, v, i: Recording(path, providers=s.providers, intra_op_threads=1),
    )
    await repo.sync()
    assert seen == [2, 4]  # warmup compiles exactly the bucket shapes
    assert await infer(repo, 3) == ("1", 3.0)
    assert seen[-1] == 2  # one row ran padded to the smallest bucket
    await repo.stop(1)


async def test_pinned_version_serves_only_that_version(tmp_path):
    for version, factor in (("1", 1.0), ("3", 3.0), ("4", 4.0)):
        scale_model(tmp_path / "repo" / version / "model.onnx", factor)
    repo = repository(tmp_path / "repo", model_version="3")
    await repo.sync()
    assert list(repo.served) == ["3"] and await infer(repo, 2) == ("3", 6.0)
    with pytest.raises(ModelNotFound):
        repo.resolve("4")
    await repo.stop(1)

    flat = scale_model(tmp_path / "flat" / "model.onnx", 2.0)
    repo = repository(flat.parent, model_version="7")
    await repo.sync()
    assert await infer(repo, 1) == ("7", 2.0)  # a flat layout takes the pinned name
    await repo.stop(1)

    missing = repository(tmp_path / "repo", model_version="9")
    await missing.sync()
    missing._scanned.set()
    assert "version 9 (--model-version) not found" in missing.not_ready_reason()


async def test_instances_run_batches_concurrently_one_per_device(tmp_path):
    import threading

    from model_server.backends.onnx import OnnxBackend

    together = threading.Barrier(2, timeout=5)
    used: list[int] = []

    class Instance(OnnxBackend):
        def infer(self, inputs):
            if inputs["x"].shape[0] == 1 and inputs["x"][0, 0] >= 100:  # not warmup
                used.append(self.device_id)
                together.wait()  # only passes if both instances run at the same time
            return super().infer(inputs)

    scale_model(tmp_path / "repo" / "1" / "model.onnx", 1.0)
    settings = make_settings(tmp_path / "repo", instances="2", max_batch_size=1, max_delay_ms=0)
    repo = ModelRepository(
        settings,
        ServerMetrics(CollectorRegistry()),
        backend_factory=lambda path, s, v, i: Instance(path, providers=s.providers, intra_op_threads=1, device_id=i),
    )
    await repo.sync()
    assert [b.device_id for b in repo.served["1"].backends] == [0, 1]
    results = await asyncio.gather(infer(repo, 100), infer(repo, 200))
    assert results == [("1", 100.0), ("1", 200.0)] and sorted(used) == [0, 1]
    await repo.stop(1)


async def test_a_slow_load_neither_blocks_requests_nor_holds_the_process(tmp_path):
    import threading

    from model_server.backends.onnx import OnnxBackend

    release = threading.Event()

    class Slow(OnnxBackend):
        def load(self):
            release.wait(10)  # e.g. MIGraphX compiling
            super().load()

    scale_model(tmp_path / "repo" / "1" / "model.onnx", 1.0)
    repo = ModelRepository(
        make_settings(tmp_path / "repo"),
        ServerMetrics(CollectorRegistry()),
        backend_factory=lambda path, s, v, i: Slow(path, providers=s.providers, intra_op_threads=1),
    )
    await repo.start()
    await asyncio.sleep(0.05)
    assert repo.not_ready_reason() == "loading the model"  # no path: /health/ready is public
    with pytest.raises(ModelNotReady, match="loading"):
        repo.resolve(None)
    loader = next(t for t in threading.enumerate() if t.name == "model-load")
    assert loader.daemon  # SIGTERM during a long compile can still exit
    release.set()
    await repo.wait_loaded()
    assert await infer(repo, 5) == ("1", 5.0)
    await repo.stop(1)
