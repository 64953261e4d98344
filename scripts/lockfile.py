"""The lock files and what they are compiled from must agree: ``requirements.lock`` records a hash of
pyproject's dependency lists in its header, and every requirement of pyproject must be pinned there at a version
it accepts; ``requirements-nodeps.lock`` records a hash of ``requirements-nodeps.in``, pins each of its
requirements at a version it accepts, and nothing else (its packages are installed ``--no-deps``).

    python scripts/lockfile.py hash            # the hash of pyproject.toml's dependency lists
    python scripts/lockfile.py check           # exit 1 (saying why) when a lock and its source disagree
    python scripts/lockfile.py stamp FILE      # write the header line into a freshly compiled lock
                                               # (requirements-nodeps.lock: the hash of requirements-nodeps.in)

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
IN_HEADER = "# requirements-in-sha256: "
NODEPS_IN, NODEPS_LOCK = ROOT / "requirements-nodeps.in", ROOT / "requirements-nodeps.lock"
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


def requirement_lines(source: Path) -> list[str]:
    """The requirements of a pip ``.in`` file, comments and blank lines left out."""
    lines = (line.split(" #", 1)[0].strip() for line in source.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def requirements_hash(source: Path) -> str:
    return hashlib.sha256("\n".join(sorted(requirement_lines(source))).encode()).hexdigest()


def _recorded(lock: Path, header: str) -> str | None:
    return next((line[len(header):].strip() for line in lock.read_text().splitlines() if line.startswith(header)),
                None)


def _stale(lock: Path, header: str, current: str, compiled_from: str) -> list[str]:
    """A problem if the hash recorded in ``lock`` under ``header`` is not ``current``."""
    recorded = _recorded(lock, header)
    if recorded == current:
        return []
    return [f"{lock.name} was compiled from {compiled_from} (recorded {recorded}, now {current}): run `make lock`"]


def _unpinned(specs: list[str], pinned: dict[str, str], lock: Path) -> list[str]:
    """What of ``specs`` ``lock`` does not pin at an accepted version."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # a fresh machine's interpreter: pip carries its own copy
        from pip._vendor.packaging.requirements import Requirement

    found = []
    for spec in specs:
        requirement = Requirement(spec)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        version = pinned.get(_normalise(requirement.name))
        if version is None:
            found.append(f"{requirement.name} is not pinned in {lock.name}")
        elif not requirement.specifier.contains(version, prereleases=True):
            found.append(f"{requirement.name}=={version} in {lock.name} does not satisfy '{spec}'")
    return found


def problems(pyproject: Path, lock: Path) -> list[str]:
    if not lock.exists():
        return [f"{lock.name} is missing: run `make lock`"]
    found = _stale(lock, HEADER, dependencies_hash(pyproject), "other dependency lists than pyproject.toml's")
    lists = dependency_lists(pyproject)
    return found + _unpinned([*lists["dependencies"], *lists[EXTRA]], pins(lock), lock)  # type: ignore[misc]


def nodeps_problems(source: Path, lock: Path) -> list[str]:
    """``lock`` pins exactly the requirements of ``source`` (installed ``--no-deps``: nothing else may come in)."""
    if not lock.exists():
        return [f"{lock.name} is missing: run `make lock`"]
    found = _stale(lock, IN_HEADER, requirements_hash(source), f"another {source.name}")
    specs, pinned = requirement_lines(source), pins(lock)
    found += _unpinned(specs, pinned, lock)
    wanted = {_normalise(re.split(r"[\s;<>=!~\[]", spec, maxsplit=1)[0]) for spec in specs}
    found += [f"{name}=={version} is pinned in {lock.name} but {source.name} does not ask for it"
              for name, version in sorted(pinned.items()) if name not in wanted]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["hash", "check", "stamp"])
    parser.add_argument("lock", nargs="?", type=Path, default=ROOT / "requirements.lock")
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    parser.add_argument("--nodeps-in", type=Path, default=NODEPS_IN)
    parser.add_argument("--nodeps-lock", type=Path, default=NODEPS_LOCK)
    args = parser.parse_args()
    if args.command == "hash":
        print(dependencies_hash(args.pyproject))
        return 0
    if args.command == "stamp":
        nodeps = args.lock.resolve() == args.nodeps_lock.resolve()
        header = IN_HEADER if nodeps else HEADER
        stamp = requirements_hash(args.nodeps_in) if nodeps else dependencies_hash(args.pyproject)
        body = [line for line in args.lock.read_text().splitlines() if not line.startswith(header)]
        args.lock.write_text("\n".join([header + stamp, *body]) + "\n")
        return 0
    found = problems(args.pyproject, args.lock) + nodeps_problems(args.nodeps_in, args.nodeps_lock)
    for problem in found:
        print(f"lock: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
