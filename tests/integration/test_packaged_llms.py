"""LLMs split over several registry packages (models/packaged.py): set-up joins the installed parts and checks the
joined file's sha256 against the repository's constant; a wrong file stops set-up with a clear message and is
never left where the server looks. Real parts, joined into a temporary directory."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from models.packaged import SPLIT_MODELS, ModelHashMismatch, join_split_model, main

MODEL = SPLIT_MODELS["qwen2.5-0.5b"]  # the smaller one: 491 MB


def test_parts_joined_out_of_order_are_refused(tmp_path: Path):
    parts = MODEL.part_paths()
    dest = tmp_path / MODEL.file
    with pytest.raises(ModelHashMismatch) as refused:
        join_split_model(MODEL, dest, parts=[parts[1], parts[0], *parts[2:]])  # the same bytes, wrong order
    message = str(refused.value)
    assert MODEL.sha256 in message and "not the model it names" in message, message
    assert list(tmp_path.iterdir()) == []  # neither the file nor its partial copy


def test_a_wrong_recorded_hash_stops_set_up_with_a_clear_message(tmp_path: Path, monkeypatch, capsys):
    wrong = dataclasses.replace(MODEL, sha256=hashlib.sha256(b"another model").hexdigest())
    monkeypatch.setitem(SPLIT_MODELS, MODEL.name, wrong)
    assert main(["join", MODEL.name, "--dest", str(tmp_path)]) == 1  # set -e: scripts/setup.sh stops here
    error = capsys.readouterr().err
    assert error.startswith("setup: qwen2.5-0.5b:") and wrong.sha256 in error and MODEL.sha256 in error, error
    assert list(tmp_path.iterdir()) == []


def test_set_up_joins_the_parts_into_the_recorded_file(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "models.packaged", "join", MODEL.name, "--dest", str(tmp_path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    joined = tmp_path / MODEL.file
    digest = hashlib.sha256()
    with joined.open("rb") as f:
        magic = f.read(4)
        digest.update(magic)
        while block := f.read(1 << 22):
            digest.update(block)
    assert (magic, joined.stat().st_size, digest.hexdigest()) == (b"GGUF", MODEL.size, MODEL.sha256)
