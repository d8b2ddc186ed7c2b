#!/usr/bin/env bash
# One run of this study's queue on a lent GPU (--device cuda --cuda-graph): ~7-8 minutes for 100k steps with the
# Impala encoder on an H200 (gpu_probe/). Run from the repository root on the GPU machine, with the wheels (tyro,
# docstring_parser, typeguard, gymnasium, cloudpickle, farama_notifications, ale_py) in .whl/:
#   RUN=impala8_none_s1 bash results/softmoe_100k_freeze/device.sh
# The complete run's files (summary, episodes, log, curve, scalars with the routing statistics) come back under
# $OUT/$RUN/.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch; print(torch.__version__)"; git rev-parse HEAD 2>/dev/null; } | tee "$OUT/machine.txt"
ONLY="^${RUN:?which run: RUN=<name>, see queue.sh --list}\$" EXTRA="--device cuda --cuda-graph" PYTHON=python3 \
  bash results/softmoe_100k_freeze/queue.sh
mkdir -p "$OUT/$RUN"
cp results/softmoe_100k_freeze/"$RUN"/* "$OUT/$RUN/"
ls -la "$OUT/$RUN"
