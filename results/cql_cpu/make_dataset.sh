#!/usr/bin/env bash
# The offline dataset of the CQL results: DQN (Nature CNN, no MoE) learns Breakout for 500k agent steps on one CPU
# core, then its replay memory (which holds every transition of the run) is written in the DQN Replay Dataset's format
# (files of 100k rows) to results/cql_cpu/work/dataset. Resumable: run it again after a stop and it goes on from its
# last checkpoint. (The dataset of these results was written during the run by the script's earlier --save-replay
# writer; benchmark/replay_to_dataset.py writes the same files from the memory.)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
mkdir -p "$ROOT/results/cql_cpu/work" && cd "$ROOT/results/cql_cpu/work"
resume=()
ckpt=$(ls -t runs/*cql_dataset*/dqn_softmoe.pt 2>/dev/null | head -1 || true)
[ -n "$ckpt" ] && resume=(--resume "$ckpt")
OMP_NUM_THREADS=1 "$PY" "$ROOT/algos/dqn_softmoe.py" --env-id ALE/Breakout-v5 --encoder nature --moe none \
  --num-envs 4 --replay-ratio 0.03125 --total-timesteps 500000 --buffer-size 520000 \
  --exp-name cql_dataset --save-model --checkpoint-replay --write-every-minutes 20 "${resume[@]}"
ckpt=$(ls -t runs/*cql_dataset*/dqn_softmoe.pt | head -1)
"$PY" "$ROOT/benchmark/replay_to_dataset.py" "$ckpt" --out dataset --rows-per-file 100000
