#!/usr/bin/env bash
# Wheels of loopscale's pure dependencies that a bare CUDA image (torch, numpy, pandas, typer, rich,
# tokenizers, safetensors... already there) may lack, for Python 3.12 on x86-64, into .whl/ (ignored by
# git). Run where pip reaches a registry; bench/gpu_check.sh installs them on the GPU machine.
set -euo pipefail
py="${PYVER:-3.12}"
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0" "typing-inspection==0.4.5" \
  "tomli-w==1.2.0" "submitit==1.5.4" "threadpoolctl==3.6.0"
ls .whl
