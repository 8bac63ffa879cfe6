#!/usr/bin/env bash
# Build a fresh venv with salt 3008.5 and extra pip arguments (used by scripts/setup.sh and
# bench/setup-saltext.sh):   salt-venv.sh VENV [pip install args...]
# salt 3008.5 pins certifi>=2026.10.23, newer than the registry has: install salt --no-deps, then its
# own requirements with only that floor relaxed (certifi 2026.10.18 works).
set -euo pipefail
VENV=${1:?usage: salt-venv.sh VENV [pip args...]}; shift
pip_q() {  # pip without the noise of this machine's pip.conf (missing local find-links dirs)
  "$VENV/bin/pip" install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v -e 'is ignored: it is neither' -e 'dependency resolver does not currently' \
          -e 'requires certifi>=' -e 'which is not installed' >&2 || true; }
}
rm -rf "$VENV"
python3 -m venv "$VENV"
pip_q --upgrade pip setuptools wheel
pip_q --no-deps salt==3008.5
"$VENV/bin/python" - > "$VENV/salt-deps.txt" <<'PY'
from importlib.metadata import requires
for r in requires("salt"):
    if "extra ==" not in r:
        print(r.replace("certifi>=2026.10.23", "certifi>=2026.10.18"))
PY
pip_q -r "$VENV/salt-deps.txt" "$@"
