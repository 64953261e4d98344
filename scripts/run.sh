#!/usr/bin/env bash
# Set up, then start `vigil serve` (args pass through) and point at the dashboard.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

# Dashboard URL: default config, or --host/--port given here (a --config file's own host/port isn't read).
host=127.0.0.1 port=8080 args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --host) host=${args[i + 1]:-$host} ;;   --host=*) host=${args[i]#*=} ;;
    --port) port=${args[i + 1]:-$port} ;;   --port=*) port=${args[i]#*=} ;;
  esac
done
[[ $host == 0.0.0.0 || $host == :: ]] && host=127.0.0.1
url="http://$host:$port/"
echo "Vigil dashboard: $url"

# Open a browser only where there is a display; once the port answers, detached (double fork, so the
# server isn't left with a zombie child) so it never blocks.
if [[ -n ${DISPLAY:-}${WAYLAND_DISPLAY:-} ]]; then
  ( (
    for _ in $(seq 60); do (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null && break; sleep 0.5; done
    xdg-open "$url" || .venv/bin/python -m webbrowser "$url"
  ) </dev/null >/dev/null 2>&1 & )
fi

exec .venv/bin/vigil serve "$@"
