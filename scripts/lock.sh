#!/usr/bin/env bash
# Refresh the lock files (`make lock`; `make lock ARGS=--upgrade` moves every pin to the newest release).
# uv resolves from PyPI for Linux x86_64, CPython 3.11, keeping the current pins where they still fit, and writes
# every transitive dependency with the sha256 of each of its files on PyPI. uv is a pinned tool in its own venv
# under .cache/ (not a project dependency).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
UV_VERSION=0.13.8
TOOLS=.cache/tools
if [[ $("$TOOLS/bin/uv" --version 2>/dev/null) != "uv $UV_VERSION"* ]]; then
  rm -rf "$TOOLS" && "$PYTHON" -m venv "$TOOLS" && "$TOOLS/bin/python" -m pip install -q "uv==$UV_VERSION"
fi
compile=("$TOOLS/bin/uv" pip compile --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28
         --no-header "$@")
# Everything pyproject.toml asks for, with the test extra (the project itself is installed --no-deps -e .).
"${compile[@]}" pyproject.toml --extra test -o requirements.lock
# Packages installed --no-deps (they declare dependencies we must not install: see scripts/setup.sh).
"${compile[@]}" --no-deps requirements-nodeps.in -o requirements-nodeps.lock
"$PYTHON" scripts/lockfile.py stamp requirements.lock
"$PYTHON" scripts/lockfile.py stamp requirements-nodeps.lock
"$PYTHON" scripts/lockfile.py check
echo "lock: requirements.lock and requirements-nodeps.lock refreshed"
