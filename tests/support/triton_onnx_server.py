"""A real NVIDIA Triton Inference Server for tests, serving a model repository written by ``vigil export-detector``.

Runs under the Triton venv's interpreter (``.venv-triton``: ``nvidia-pytriton`` pins ``numpy<2``, which the
project venv cannot take), not the project venv. The ``tritonserver`` binary inside the ``nvidia-pytriton`` wheel
ships only Triton's Python backend (no onnxruntime backend), so the exported ``model.onnx`` is bound to Triton as
a Python callable that runs it with onnxruntime; clients see a normal Triton model (KServe v2 gRPC/HTTP, dynamic
batching) with the name, inputs and outputs the repository's ``config.pbtxt`` declares.

    python tests/support/triton_onnx_server.py --repository DIR --model NAME --grpc-port P --http-port Q
"""

from __future__ import annotations

import argparse
import logging
import os
import sysconfig
from pathlib import Path

import numpy as np
import onnxruntime
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.models.model import Model
from pytriton.triton import Triton, TritonConfig


def serve_metadata_parameter(config_pbtxt: Path) -> None:
    """Carry the repository's ``metadata`` parameter (task, names, keypoints) into the served model's config, as
    Triton does for a config.pbtxt (PyTriton writes its own config and has no option for extra parameters)."""
    text = config_pbtxt.read_text()
    if 'key: "metadata"' not in text:
        return
    raw = text.split('string_value: "', 1)[1].rsplit('"', 1)[0].replace('\\"', '"').replace("\\\\", "\\")
    original = Model._get_triton_model_config

    def with_metadata(self: Model):  # type: ignore[no-untyped-def]
        config = original(self)
        config.backend_parameters["metadata"] = raw
        return config

    Model._get_triton_model_config = with_metadata  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repository", required=True, type=Path)
    parser.add_argument("--model", required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--max-batch", type=int, default=16)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # The Python backend's stub links libpython3.X.so by soname: without this it may load the system's (e.g.
    # Debian's 3.11.2) beside this interpreter's standard library (3.11.7) and fail in multiprocessing.
    libdir = sysconfig.get_config_var("LIBDIR")
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libdir, os.environ.get("LD_LIBRARY_PATH")]))

    serve_metadata_parameter(args.repository / args.model / "config.pbtxt")
    onnx_path = args.repository / args.model / "1" / "model.onnx"
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    output_name = session.get_outputs()[0].name

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        return {output_name: session.run([output_name], {input_name: inputs[input_name]})[0]}

    config = TritonConfig(grpc_port=args.grpc_port, http_port=args.http_port, metrics_port=args.metrics_port,
                          grpc_address="127.0.0.1", http_address="127.0.0.1")
    with Triton(config=config) as triton:
        triton.bind(
            model_name=args.model,
            infer_func=infer,
            inputs=[Tensor(name=input_name, dtype=np.float32, shape=(3, -1, -1))],
            outputs=[Tensor(name=output_name, dtype=np.float32, shape=(-1, -1))],
            config=ModelConfig(max_batch_size=args.max_batch,
                               batcher=DynamicBatcher(max_queue_delay_microseconds=2000)),
            strict=False,
        )
        print("READY", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
