"""Settings from flags and env, the CLI front door, and GPU metric sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from model_server.__main__ import build_parser, main, settings_from_args
from model_server.gpu import GpuCollector, GpuSample, parse_rocm_smi_json
from model_server.metrics import ServerMetrics
from model_server.settings import ServerSettings, default_model_name, flag_name


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith("MODEL_SERVER_") or key == "MODEL_NAME":
            monkeypatch.delenv(key)


def test_same_settings_from_env(monkeypatch):
    monkeypatch.setenv("MODEL_SERVER_MODEL", "/mnt/models")
    monkeypatch.setenv("MODEL_NAME", "resnet")
    monkeypatch.setenv("MODEL_SERVER_PROVIDERS", "ROCMExecutionProvider, CPUExecutionProvider")
    monkeypatch.setenv("MODEL_SERVER_MAX_BATCH_SIZE", "32")
    monkeypatch.setenv("MODEL_SERVER_MAX_DELAY_MS", "2.5")
    monkeypatch.setenv("MODEL_SERVER_WATCH", "false")
    settings = settings_from_args(build_parser().parse_args(["serve", "--max-queue", "8"]))
    assert settings.name == "resnet" and settings.max_batch_size == 32
    assert settings.providers == ["ROCMExecutionProvider", "CPUExecutionProvider"]
    assert settings.max_delay_ms == 2.5 and settings.watch is False and settings.max_queue == 8


def test_flags_win_over_env(monkeypatch):
    monkeypatch.setenv("MODEL_SERVER_MAX_BATCH_SIZE", "32")
    monkeypatch.setenv("MODEL_SERVER_MODEL_NAME", "from-env")
    args = build_parser().parse_args(["serve", "--model", "m.onnx", "--max-batch-size", "4", "--model-name", "cli"])
    settings = settings_from_args(args)
    assert settings.max_batch_size == 4 and settings.name == "cli"


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/mnt/models", "models"),
        ("/srv/resnet50.onnx", "resnet50"),
        ("/x/bert.pt2", "bert"),
        ("/x/v1.2", "v1.2"),
    ],
)
def test_default_model_name_is_the_stem(path, name):
    assert default_model_name(Path(path)) == name
    assert ServerSettings(model=Path(path)).name == name


def test_invalid_settings_exit_2_with_the_field_named(monkeypatch, capsys):
    monkeypatch.setenv("MODEL_SERVER_MAX_BATCH_SIZE", "lots")
    assert main(["serve", "--model", "m.onnx"]) == 2
    err = capsys.readouterr().err
    assert "max_batch_size" in err and "MODEL_SERVER_MAX_BATCH_SIZE" in err
    monkeypatch.delenv("MODEL_SERVER_MAX_BATCH_SIZE")
    assert main(["serve"]) == 2
    assert "model" in capsys.readouterr().err
    # A flag named apart from its field is named as the user wrote it.
    assert main(["serve", "--model", "m.onnx", "--drain-timeout", "-1"]) == 2
    assert "--drain-timeout or MODEL_SERVER_DRAIN_TIMEOUT_S" in capsys.readouterr().err


def test_every_setting_is_a_serve_flag_and_every_flag_a_setting():
    argv = ["serve"]
    for field, info in ServerSettings.model_fields.items():
        argv += [f"--{flag_name(field)}"] + ([] if info.annotation is bool else ["1"])
    given = set(vars(build_parser().parse_args(argv))) - {"command"}
    assert given == set(ServerSettings.model_fields)
    args = build_parser().parse_args(["serve", "--model", "m", "--shutdown-delay", "2.5", "--no-warmup"])
    settings = settings_from_args(args)
    assert (settings.shutdown_delay_s, settings.warmup) == (2.5, False)


def test_rocm_smi_json_parsing():
    text = json.dumps(
        {
            "card0": {
                "GPU use (%)": "87",
                "VRAM Total Memory (B)": "68702699520",
                "VRAM Total Used Memory (B)": "1073741824",
            },
            "card1": {"GPU use (%)": "N/A", "VRAM Total Used Memory (B)": "42"},
            "system": {"Driver version": "6.8"},
        }
    )
    assert parse_rocm_smi_json(text) == [
        GpuSample("0", 87.0, 1073741824.0),
        GpuSample("1", None, 42.0),
    ]


def test_gpu_collector_reads_at_most_once_per_ttl():
    calls = []

    def reader():
        calls.append(1)
        return [GpuSample("0", float(len(calls)), 10.0)]

    registry = CollectorRegistry()
    registry.register(GpuCollector(reader, ttl=60))
    first = generate_latest(registry).decode()
    second = generate_latest(registry).decode()
    assert 'model_server_gpu_utilization_percent{gpu="0"} 1.0' in first and first == second
    assert len(calls) == 1


def test_gpu_gauges_absent_without_a_reader():
    registry = CollectorRegistry()
    ServerMetrics(registry, gpu_reader=None)
    assert "gpu" not in generate_latest(registry).decode()


def test_batch_buckets():
    from model_server.settings import resolve_buckets

    assert resolve_buckets("auto", 16, prefers_static_shapes=True) == [1, 2, 4, 8, 16]
    assert resolve_buckets("auto", 12, prefers_static_shapes=True) == [1, 2, 4, 8, 12]
    assert resolve_buckets("auto", 16, prefers_static_shapes=False) is None
    assert resolve_buckets("off", 16, prefers_static_shapes=True) is None
    assert resolve_buckets("4, 1,32", 16, prefers_static_shapes=False) == [1, 4, 16]
    with pytest.raises(ValueError, match="batch_buckets"):
        ServerSettings(model=Path("m.onnx"), batch_buckets="small")


def test_instances_follow_the_visible_gpus():
    from model_server.settings import resolve_instances

    env = {"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1"}
    assert resolve_instances("auto", on_gpu=True, env=env) == 2
    assert resolve_instances("auto", on_gpu=True, env={"HIP_VISIBLE_DEVICES": "3"}) == 1
    assert resolve_instances("auto", on_gpu=True, env={}) == 1
    assert resolve_instances("auto", on_gpu=False, env=env) == 1  # CPU: one session is enough
    assert resolve_instances("3", on_gpu=False, env={}) == 3
    with pytest.raises(ValueError, match="instances"):
        ServerSettings(model=Path("m.onnx"), instances="0")
