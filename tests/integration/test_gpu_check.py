"""``scripts/gpu-check.sh --dry-run`` runs its pipeline ÷ raw step (``bench.gpu_check``) on this CPU: the harness a
lent GPU will run, checked where there is none (short legs: the figures themselves mean nothing here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support.vigil_process import REPO_ROOT


def test_gpu_check_dry_run_prints_pipeline_over_raw_per_row():
    env = {**os.environ, "VIGIL_PYTHON": sys.executable, "PYTHONPATH": str(REPO_ROOT), "GPU_CHECK_SECONDS": "1",
           "GPU_CHECK_STREAMS": "1,2", "GPU_CHECK_WORKERS": "0,1"}
    done = subprocess.run(["bash", "scripts/gpu-check.sh", "--dry-run"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pipeline ÷ raw" in done.stdout
    rows = {int(m.group(1)): m.group(0) for m in re.finditer(r"^\s+(\d+)\s+\d+\s+[\d.]+ \|.*$", done.stdout, re.M)}
    assert sorted(rows) == [1, 2], done.stdout
    for row in rows.values():  # raw, then per workers value: fps, ÷ raw, loop ms/frame; every figure measured
        cells = row.split("|")
        assert len(cells) == 3 and all(float(v) > 0 for cell in cells for v in cell.split()), row
