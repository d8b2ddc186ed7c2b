#!/usr/bin/env bash
# Table 1's four shallow rows at the paper's budget: 10 runs x 200,000 episodes per activation in one batched process
# (one torch thread, the --compile default), every other setting the paper's (the script's defaults).
#   bash command.sh                                  # from scratch
#   bash command.sh --resume runs/<run>/td_lambda_tetris.pt   # goes on exactly where the checkpoint stopped
cd "$(dirname "$0")"
exec ../../.venv/bin/python ../../algos/td_lambda_tetris.py --activation dsilu sigmoid silu relu \
  --num-runs 10 --total-episodes 200000 --compile --save-model --exp-name table1_paper "$@"
