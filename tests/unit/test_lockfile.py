"""requirements.lock agrees with pyproject.toml (CI fails when one changes without the other)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCKFILE = ROOT / "scripts" / "lockfile.py"


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(LOCKFILE), "check", *args], capture_output=True, text=True,
                          timeout=60)


def test_the_lock_matches_pyproject() -> None:
    result = _check()
    assert result.returncode == 0, result.stderr
    assert "--hash=sha256:" in (ROOT / "requirements.lock").read_text()
    assert "--hash=sha256:" in (ROOT / "requirements-nodeps.lock").read_text()


def test_a_dependency_added_to_pyproject_without_a_new_lock_fails(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text((ROOT / "pyproject.toml").read_text().replace(
        'dependencies = [\n', 'dependencies = [\n    "left-pad-for-test>=1",\n', 1))
    result = _check("--pyproject", str(pyproject))
    assert result.returncode == 1
    assert "make lock" in result.stderr and "left-pad-for-test is not pinned" in result.stderr


def test_a_pin_outside_pyprojects_range_fails(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text((ROOT / "requirements.lock").read_text().replace("\ntorch==2.14.1 ", "\ntorch==2.13.0 ", 1))
    result = _check(str(lock))
    assert result.returncode == 1 and "torch==2.13.0" in result.stderr
