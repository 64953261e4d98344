#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (e.g. one lent by the `device` tool): the packaged detector on CUDA in FP16
# (models.detector.device: cuda:0, half: true), its images/s, then the cameras capacity figure of
# bench/capacity.py --cameras with that detector, in minutes. Needs only this repo and the venv scripts/setup.sh
# made; nothing is downloaded. Without nvidia-smi it says so and exits 0.
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
exec "$PY" -m bench.capacity --cameras "${1:-1,8,16}" --seconds "${GPU_CHECK_SECONDS:-8}" --warmup 3 --turns 3 \
  --detector-device cuda:0 --half --no-ungated
