"""The lock files and pyproject.toml must agree: ``requirements.lock`` records a hash of pyproject's dependency
lists in its header, and every requirement of pyproject must be pinned there at a version it accepts.

    python scripts/lockfile.py hash            # the hash of pyproject.toml's dependency lists
    python scripts/lockfile.py check           # exit 1 (saying why) when pyproject and the lock disagree
    python scripts/lockfile.py stamp FILE      # write the header line into a freshly compiled lock

Only the standard library and ``packaging`` (pip's own copy when it is not installed) are used, so this runs
before any set-up, on a fresh machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADER = "# pyproject-dependencies-sha256: "
EXTRA = "test"  # the extra the lock installs


def dependency_lists(pyproject: Path) -> dict[str, object]:
    project = tomllib.loads(pyproject.read_text())["project"]
    return {"requires-python": project.get("requires-python"), "dependencies": project.get("dependencies", []),
            EXTRA: project.get("optional-dependencies", {}).get(EXTRA, [])}


def dependencies_hash(pyproject: Path) -> str:
    canonical = json.dumps(dependency_lists(pyproject), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def pins(lock: Path) -> dict[str, str]:
    """name (normalised) -> pinned version."""
    found = {}
    for line in lock.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
        if match:
            found[_normalise(match[1])] = match[2]
    return found


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def problems(pyproject: Path, lock: Path) -> list[str]:
    try:
        from packaging.requirements import Requirement
    except ImportError:  # a fresh machine's interpreter: pip carries its own copy
        from pip._vendor.packaging.requirements import Requirement

    if not lock.exists():
        return [f"{lock.name} is missing: run `make lock`"]
    text = lock.read_text()
    recorded = next((line[len(HEADER):].strip() for line in text.splitlines() if line.startswith(HEADER)), None)
    found = []
    if recorded != dependencies_hash(pyproject):
        found.append(f"{lock.name} was compiled from other dependency lists than pyproject.toml's "
                     f"(recorded {recorded}, now {dependencies_hash(pyproject)}): run `make lock`")
    pinned = pins(lock)
    lists = dependency_lists(pyproject)
    for spec in [*lists["dependencies"], *lists[EXTRA]]:  # type: ignore[misc]
        requirement = Requirement(spec)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        version = pinned.get(_normalise(requirement.name))
        if version is None:
            found.append(f"{requirement.name} is not pinned in {lock.name}")
        elif not requirement.specifier.contains(version, prereleases=True):
            found.append(f"{requirement.name}=={version} in {lock.name} does not satisfy '{spec}'")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["hash", "check", "stamp"])
    parser.add_argument("lock", nargs="?", type=Path, default=ROOT / "requirements.lock")
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    args = parser.parse_args()
    if args.command == "hash":
        print(dependencies_hash(args.pyproject))
        return 0
    if args.command == "stamp":
        body = [line for line in args.lock.read_text().splitlines() if not line.startswith(HEADER)]
        args.lock.write_text("\n".join([HEADER + dependencies_hash(args.pyproject), *body]) + "\n")
        return 0
    found = problems(args.pyproject, args.lock)
    for problem in found:
        print(f"lock: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
