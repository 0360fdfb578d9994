"""The model server's gRPC message classes, generated from its .proto with grpcio-tools.

The generated module is committed (the server image then needs no protobuf compiler, and mypy
reads its .pyi); `python -m testsupport.grpc_codegen` rewrites it after a change to the .proto,
and a test checks that the committed files are what this makes of the .proto now.

One change to protoc's output: the messages live in a descriptor pool of their own instead of
protobuf's default pool. Triton's and KServe's client stubs declare the same `inference.*`
names in the default pool, and a second file declaring them there fails at import, so without it
the server's module and either client could not be imported by one process.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

SERVER_ROOT = Path(__file__).resolve().parent.parent / "server"
PROTO = Path("model_server/grpc_predict_v2.proto")
OUTPUTS = (Path("model_server/grpc_predict_v2_pb2.py"), Path("model_server/grpc_predict_v2_pb2.pyi"))

DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
OWN_POOL = (
    "# A pool of its own: client stubs (Triton's, KServe's) declare the same names in the default one.\n"
    "POOL = _descriptor_pool.DescriptorPool()\n"
    "DESCRIPTOR = POOL.AddSerializedFile("
)


def generate(root: Path = SERVER_ROOT) -> dict[Path, str]:
    """The generated files' text by path (relative to `root`), from `root / PROTO`."""
    with tempfile.TemporaryDirectory() as out:
        status = protoc.main(["protoc", f"-I{root}", f"--python_out={out}", f"--pyi_out={out}", str(root / PROTO)])
        if status != 0:
            raise RuntimeError(f"protoc failed on {root / PROTO} ({status})")
        files = {path: (Path(out) / path).read_text() for path in OUTPUTS}
    module = files[OUTPUTS[0]]
    if module.count(DEFAULT_POOL) != 1:
        raise RuntimeError("protoc's output no longer declares its file in the default pool as expected")
    files[OUTPUTS[0]] = module.replace(DEFAULT_POOL, OWN_POOL)
    return files


def main() -> int:
    for path, text in generate().items():
        (SERVER_ROOT / path).write_text(text)
        print(f"wrote {SERVER_ROOT / path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
