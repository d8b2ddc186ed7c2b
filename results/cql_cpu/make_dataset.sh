#!/usr/bin/env bash
# The offline dataset of the CQL results (issue 10): DQN (Nature CNN, no MoE) learns Breakout for 500k agent steps
# on one CPU core and writes its replay in the DQN Replay Dataset's format (5 checkpoint files of 100k rows) to
# results/cql_cpu/work/dataset. Resumable: run it again after a stop and it continues from its last checkpoint.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
mkdir -p "$ROOT/results/cql_cpu/work" && cd "$ROOT/results/cql_cpu/work"
resume=()
ckpt=$(ls -t runs/*cql_dataset*/dqn_softmoe.pt 2>/dev/null | head -1 || true)
[ -n "$ckpt" ] && resume=(--resume "$ckpt")
OMP_NUM_THREADS=1 "$PY" "$ROOT/algos/dqn_softmoe.py" --env-id ALE/Breakout-v5 --encoder nature --moe none \
  --num-envs 4 --replay-ratio 0.03125 --total-timesteps 500000 --buffer-size 500000 \
  --save-replay dataset --save-replay-rows 100000 \
  --exp-name cql_dataset --save-model --checkpoint-replay --write-every-minutes 20 "${resume[@]}"
