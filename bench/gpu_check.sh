#!/usr/bin/env bash
# The one prepared GPU check (bench/gpu_check.py) on a CUDA machine, from the repository root:
#
#   bash bench/gpu_check.sh [OUT] [gpu_check.py options]     # OUT: $OUT or ./gpu_check_out
#
# It uses the machine's own torch (never installs one). Where the machine cannot reach a package
# registry, run bench/gpu_wheels.sh first where pip works and bring the .whl/ folder along: the
# wheels are installed into a private target, nothing else on the machine changes. ~9 minutes.
set -euo pipefail
out="${1:-${OUT:-gpu_check_out}}"
shift || true
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/loopscale-site .whl/*.whl
  export PYTHONPATH="/tmp/loopscale-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
timeout 590 python3 bench/gpu_check.py --out "$out" "$@"
