#!/usr/bin/env bash
# hpcdist — Flux, CPU.   UNTESTED (no Flux instance here): check against your site's documentation.
#
# Runs:   flux run -N NODES -n RANKS -o pmi=simple python SCRIPT ARGS...
#         (Flux's PMI-1 "simple" server wires up the embedded MPICH; Open MPI wants -o pmi=pmix)
# Submit: flux batch -N 2 -n 8 jobs/flux_cpu.sh [script.py args...]
# Edit:   the flux batch sizes on the command line (or #flux: directives below); PYTHON.
#
# Outside Flux this script says it must be submitted with flux batch and exits 2.
#flux: --job-name=hpcdist-cpu
#flux: -t 10m

if [ -z "${FLUX_JOB_ID:-}" ]; then
  echo "flux_cpu.sh: not inside a Flux job; submit it with: flux batch -N 2 -n 8 $0 [script.py args...]" >&2
  exit 2
fi
set -euo pipefail
PYTHON="${PYTHON:-python3}"
if [ "$#" -eq 0 ]; then set -- examples/train_demo.py; fi
exec flux run -N "$(flux resource list -no '{nnodes}' 2>/dev/null || echo 1)" -n "${FLUX_JOB_SIZE:-$(flux resource list -no '{ncores}')}" \
  -o pmi=simple "$PYTHON" "$@"
