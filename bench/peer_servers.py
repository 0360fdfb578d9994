"""The peer servers of bench/peer_bench.py, each serving one ONNX model over the
Open Inference Protocol (KServe v2) REST API as model `m`, the way its own docs show.

Runs inside a peer's venv (bench/setup-peers.sh), so it imports nothing from this
project: only the standard library, numpy, onnxruntime and the peer's package.

    kserve   - KServe's ModelServer with a `kserve.Model` whose `predict` runs the session
               (no batching: KServe's Python server has none);
    pytriton - PyTriton: Triton's HTTP front end and dynamic batcher in front of a
               Python callable that runs the same session (`@batch`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def session(path: str, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def run_kserve(args: argparse.Namespace) -> None:
    import kserve
    from kserve import InferOutput, InferRequest, InferResponse

    sess = session(args.model, args.threads)

    class OnnxModel(kserve.Model):
        def __init__(self) -> None:
            super().__init__("m")
            self.ready = True

        def predict(self, payload: InferRequest, headers: dict[str, str] | None = None) -> InferResponse:
            x = payload.inputs[0].as_numpy()
            y = sess.run(None, {"x": x})[0]
            output = InferOutput(name="y", shape=list(y.shape), datatype="FP32", data=y)
            return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=[output])

    kserve.ModelServer(
        http_port=args.port, grpc_port=args.grpc_port, enable_grpc=False, enable_latency_logging=False
    ).start([OnnxModel()])


def run_pytriton(args: argparse.Namespace) -> None:
    import numpy as np
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    sess = session(args.model, args.threads)

    @batch
    def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        return {"y": sess.run(None, {"x": x})[0]}

    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        allow_metrics=False,
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name="m",
            infer_func=infer,
            inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(
                max_batch_size=args.max_batch_size,
                batcher=DynamicBatcher(max_queue_delay_microseconds=int(args.max_delay_ms * 1000)),
            ),
            strict=False,
        )
        triton.serve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("peer", choices=["kserve", "pytriton"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0 = ORT default)")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-delay-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    {"kserve": run_kserve, "pytriton": run_pytriton}[args.peer](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
