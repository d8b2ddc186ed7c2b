#!/usr/bin/env bash
# Named suites of experiments at a chosen budget and number of seeds. Each run is one plain command line, printed
# before it runs, so it can be copied and reused. Results land in runs/{run_name}/ (tensorboard, summary.json, CSV, PNG).
#
#   bash benchmark.sh SUITE [--episodes N] [--runs N] [--seeds "1 2 3"] [--dry-run] [-- extra flags for every run]
#
# Suites:
#   tetris-table1   Table 1: shallow SiLU / ReLU / dSiLU / sigmoid (10 runs each) and deep SiLU-SiLU / ReLU-ReLU /
#                   SiLU-dSiLU (5 runs each) on stochastic SZ-Tetris. Paper budget: 200,000 episodes.
#   tetris-10x10    Fig. 4: shallow dSiLU with 250 hidden units on 10x10 Tetris, 5 runs. Paper budget: 400,000 episodes.
#   tetris-table3   Table 3 and Fig. 6: trains the shallow dSiLU agent, then evaluates softmax (final tau) and
#                   epsilon-greedy (0, 0.001, 0.01, 0.05) and writes the value analysis (V(s_t) vs R_t).
#   tetris-speed    placements per second of the Gymnasium env, the batched engine and the training loop.
#
# --episodes defaults to the paper's budget; --runs overrides the number of batched runs per configuration; each seed
# in --seeds is one more command (the runs of one command are already independent).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3

suite=${1:-}
shift || true
episodes="" runs="" seeds="1" dry=0 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --episodes) episodes=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "benchmark.sh: unknown option $1 (see the header of benchmark.sh)" >&2; exit 2 ;;
  esac
done

run() {  # print the command, then run it (unless --dry-run)
  echo "+ $*"
  [ "$dry" = 1 ] || "$@"
}

td() {  # td DEFAULT_EPISODES DEFAULT_RUNS flags...
  local default_episodes=$1 default_runs=$2
  shift 2
  for seed in $seeds; do
    run "$PY" algos/td_lambda_tetris.py --seed "$seed" --total-episodes "${episodes:-$default_episodes}" \
      --num-runs "${runs:-$default_runs}" "$@" "${extra[@]}"
  done
}

case "$suite" in
  tetris-table1)
    for act in silu relu dsilu sigmoid; do td 200000 10 --network shallow --activation "$act"; done
    for act in silu-silu relu-relu silu-dsilu; do td 200000 5 --network deep --activation "$act"; done
    ;;
  tetris-10x10)
    td 400000 5 --env-id envs/Tetris10x10-v0 --activation dsilu
    ;;
  tetris-table3)
    td 200000 1 --activation dsilu --save-model --eval-episodes 1000 \
      --eval-selections softmax epsilon:0 epsilon:0.001 epsilon:0.01 epsilon:0.05
    ;;
  tetris-speed)
    run "$PY" -m envs --benchmark-seconds 10
    for n in 1 10 32; do
      td "${episodes:-1000}" "$n" --activation dsilu --log-every-seconds 1000 --exp-name "speed_runs$n"
    done
    ;;
  *)
    sed -n '2,17p' "$0"
    [ -z "$suite" ] && exit 0
    echo "benchmark.sh: unknown suite '$suite'" >&2
    exit 2
    ;;
esac
