"""Regenerate the gRPC stubs from inference.proto: ``python -m server.grpc_api.generate`` (from the repo root).

The generated modules are committed (tests/integration/test_grpc.py checks they match what this produces), so
running the server needs grpcio and protobuf only; grpcio-tools is needed to regenerate.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO = "server/grpc_api/inference.proto"  # relative to the repo root, so imports read `from server.grpc_api ...`
GENERATED = ("inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py")


def generate(out_dir: Path = REPO_ROOT) -> list[Path]:
    """Write the stubs under ``out_dir``/server/grpc_api/; returns their paths."""
    from grpc_tools import protoc

    well_known = str(resources.files("grpc_tools") / "_proto")
    args = ["protoc", f"-I{REPO_ROOT}", f"-I{well_known}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}", str(REPO_ROOT / PROTO)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    return [out_dir / "server" / "grpc_api" / name for name in GENERATED]


if __name__ == "__main__":
    for path in generate():
        print(path.relative_to(REPO_ROOT), file=sys.stderr)
