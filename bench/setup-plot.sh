#!/usr/bin/env bash
# Idempotent: matplotlib for bench/plot.py, in a venv of its own (never in the test requirements or our
# runtime venv). Prints "venv: PATH" last.
set -euo pipefail
CACHE=${SALT_VIRT_CACHE:-/var/cache/salt-virt}
VENV=${SALT_VIRT_BENCH_PLOT_VENV:-$CACHE/bench-plot-venv}
STAMP="$VENV/.ok-matplotlib-3.9"
if [ ! -f "$STAMP" ]; then
  printf '[bench-setup %(%T)T] building %s (matplotlib)\n' -1 "$VENV" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "matplotlib>=3.9,<3.11" 2>&1 \
    | { grep -v -e 'is ignored: it is neither' >&2 || true; }
  "$VENV/bin/python" -c 'import matplotlib' || { echo "bench-setup: matplotlib venv incomplete" >&2; exit 1; }
  touch "$STAMP"
fi
echo "venv: $VENV"
