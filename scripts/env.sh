# Sourced by scripts/test and scripts/demo: create or reuse the project's
# virtual environment in .venv and install hpcdist into it (editable).
# HPCDIST_VENV overrides the location; HPCDIST_EXTRAS the extras installed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HPCDIST_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[hpcdist] creating virtual environment in $VENV"
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
stamp="$VENV/.hpcdist-installed-$1"
if [ ! -f "$stamp" ] || [ "$ROOT/setup.cfg" -nt "$stamp" ]; then
  echo "[hpcdist] installing hpcdist[$2] into $VENV"
  python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
  if [ "${3:-}" = "with-torch" ]; then
    # CPU build from the local wheel cache; an unpinned torch pulls a multi-GB CUDA build.
    python -m pip install -q --disable-pip-version-check "torch==2.13.0" || echo "[hpcdist] torch==2.13.0 not installable here: torch tests will skip"
  fi
  python -m pip install -q --disable-pip-version-check -e "$ROOT[$2]"
  touch "$stamp"
fi
export PYTHONUNBUFFERED=1
