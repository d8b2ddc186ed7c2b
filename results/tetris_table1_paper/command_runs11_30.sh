#!/usr/bin/env bash
# Table 1's four shallow rows, runs 11-30: 20 more runs x 200,000 episodes per activation in one batched process
# (one torch thread), seeds disjoint from command.sh's first ten (network inits 11-30, another piece stream), every
# other setting as command.sh.
#   bash command_runs11_30.sh                                  # from scratch
#   bash command_runs11_30.sh --resume runs/<run>/td_lambda_tetris.pt   # goes on exactly where the checkpoint stopped
cd "$(dirname "$0")"
exec ../../.venv/bin/python ../../algos/td_lambda_tetris.py --activation dsilu sigmoid silu relu \
  --seed 11 --num-runs 20 --total-episodes 200000 --compile --save-model --exp-name table1_runs11_30 "$@"
