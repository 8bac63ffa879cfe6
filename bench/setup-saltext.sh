#!/usr/bin/env bash
# Idempotent: the competitor, saltext-virt 0.1.0 from PyPI, in a venv of its own (salt 3008.5 with the
# same two-step install as scripts/setup.sh, libvirt-python 12.8.0). Prints "venv: PATH" last.
set -euo pipefail
CACHE=${SALT_VIRT_CACHE:-/var/cache/salt-virt}
VENV=${SALT_VIRT_BENCH_SALTEXT_VENV:-$CACHE/bench-saltext-venv}
STAMP="$VENV/.ok-saltext-virt-0.1.0-salt-3008.5-libvirt-12.8.0"
log() { printf '[bench-setup %(%T)T] %s\n' -1 "$*" >&2; }
pip_q() {
  "$VENV/bin/pip" install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v -e 'is ignored: it is neither' -e 'dependency resolver does not currently' \
          -e 'requires certifi>=' -e 'which is not installed' >&2 || true; }
}
if [ ! -f "$STAMP" ]; then
  log "building $VENV (saltext-virt==0.1.0)"
  bash "$(dirname "$0")/../scripts/salt-venv.sh" "$VENV" libvirt-python==12.8.0
  # saltext-virt pins "salt>=..." only; --no-deps keeps our salt 3008.5, its other deps come next.
  pip_q --no-deps saltext-virt==0.1.0
  "$VENV/bin/python" - > "$VENV/saltext-deps.txt" <<'PY'
from importlib.metadata import requires
for r in requires("saltext-virt") or []:
    if "extra ==" not in r and not r.lower().startswith("salt") :
        print(r)
PY
  [ -s "$VENV/saltext-deps.txt" ] && pip_q -r "$VENV/saltext-deps.txt"
  "$VENV/bin/python" -c 'import salt.version, libvirt, saltext.virt' || { echo "bench-setup: venv incomplete" >&2; exit 1; }
  touch "$STAMP"
fi
echo "venv: $VENV"
