"""A Hugging Face model directory (safetensors + tokenizer + chat template) made offline from a packaged GGUF, for
`vllm serve` (scripts/setup-vllm.sh runs it with .venv-vllm's Python; nothing is downloaded).

    .venv-vllm/bin/python scripts/vllm_model.py MODEL.gguf OUT_DIR

transformers reads the GGUF (metadata, tokenizer and chat template included) and dequantizes it; the weights are
written in float32: served in bfloat16 (vLLM's CPU default here) SmolLM2-135M answered "What is the capital of
France?" with "L'Étoile, la Marseillaise, ..." where float32 (and llama.cpp on the GGUF) says Paris, so the test
server passes --dtype float32 as well.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantized on loading, but the model still says "GGUF-quantized" and refuses to be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if not tokenizer.chat_template:
        raise SystemExit(f"{gguf} carries no chat template: vLLM's /v1/chat/completions needs one")
    partial = out.with_name(out.name + ".partial")  # a half-written directory never looks finished
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
