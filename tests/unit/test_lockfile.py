"""requirements.lock agrees with pyproject.toml, requirements-nodeps.lock with requirements-nodeps.in (CI fails
when one changes without the other)."""

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


NODEPS_IN = ROOT / "requirements-nodeps.in"
NODEPS_LOCK = ROOT / "requirements-nodeps.lock"


def _check_nodeps(source: Path = NODEPS_IN, lock: Path = NODEPS_LOCK) -> subprocess.CompletedProcess[str]:
    return _check("--nodeps-in", str(source), "--nodeps-lock", str(lock))


def test_a_nodeps_requirement_changed_without_a_new_lock_fails(tmp_path: Path) -> None:
    source = tmp_path / "requirements-nodeps.in"
    source.write_text(NODEPS_IN.read_text().replace("pipecat-ai==1.14.0", "pipecat-ai==1.15.0", 1))
    result = _check_nodeps(source=source)
    assert result.returncode == 1
    assert "compiled from another requirements-nodeps.in" in result.stderr and "make lock" in result.stderr
    assert "pipecat-ai==1.14.0 in requirements-nodeps.lock does not satisfy 'pipecat-ai==1.15.0'" in result.stderr


def test_a_nodeps_requirement_added_without_a_new_lock_fails(tmp_path: Path) -> None:
    source = tmp_path / "requirements-nodeps.in"
    source.write_text(NODEPS_IN.read_text() + "left-pad-for-test==1.0\n")
    result = _check_nodeps(source=source)
    assert result.returncode == 1 and "left-pad-for-test is not pinned in requirements-nodeps.lock" in result.stderr


def test_a_nodeps_lock_that_pins_more_than_asked_fails(tmp_path: Path) -> None:
    # Installed --no-deps: a package the .in does not name must not come in through the lock.
    lock = tmp_path / "requirements-nodeps.lock"
    lock.write_text(NODEPS_LOCK.read_text() + "numpy==2.0.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    result = _check_nodeps(lock=lock)
    assert result.returncode == 1
    assert "numpy==2.0.0 is pinned in requirements-nodeps.lock but requirements-nodeps.in does not ask for it" in (
        result.stderr)


def test_comments_in_the_nodeps_source_do_not_matter(tmp_path: Path) -> None:
    source = tmp_path / "requirements-nodeps.in"
    source.write_text("# a new comment\n\n" + NODEPS_IN.read_text())
    assert _check_nodeps(source=source).returncode == 0
