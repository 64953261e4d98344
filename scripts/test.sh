#!/usr/bin/env bash
# Lint, then run pytest inside a private network namespace (loopback only), so no test can reach
# or be reached from the network. Extra args go to pytest: scripts/test.sh -k foo
# `scripts/test.sh --exec CMD...` runs CMD in the same sandbox instead (used by `make bench`).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/sbin:/sbin  # `ip` lives in sbin, which non-root PATHs often lack

bash scripts/setup.sh

# Run "$@" with only a loopback interface. Plain `unshare -n` needs root (CAP_SYS_ADMIN); a user
# namespace (-r) gets the same isolation unprivileged. Never fall back to the real network.
offline() {
  local flags
  if unshare -n true 2>/dev/null; then flags=-n
  elif unshare -rn true 2>/dev/null; then flags=-rn
  else
    echo "test: cannot create a private network namespace (unshare -n / -rn not permitted);" \
         "run as root or enable unprivileged user namespaces. Refusing to run on the real network." >&2
    exit 1
  fi
  unshare "$flags" bash -c 'ip link set lo up && exec "$@"' offline "$@"
}

if [[ ${1:-} == --exec ]]; then
  shift
  offline "$@"
  exit
fi

echo "== ruff check"
.venv/bin/ruff check .

echo "== pytest (private network namespace)"
rc=0
offline .venv/bin/pytest "$@" || rc=$?
((rc != 5)) || echo "test: pytest collected no tests; counting that as a failure" >&2
exit "$rc"  # 5 (nothing collected) is non-zero, so it fails like any other error
