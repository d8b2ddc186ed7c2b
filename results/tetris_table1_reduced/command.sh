#!/usr/bin/env bash
# Table 1's four shallow rows, reduced budget (3,000 of 200,000 episodes per run), one batched process, one thread.
cd "$(dirname "$0")"
OMP_NUM_THREADS=1 exec ../../.venv/bin/python ../../algos/td_lambda_tetris.py --network shallow \
  --activation dsilu sigmoid silu relu --num-runs 10 --total-episodes 3000 --reward-timing next --save-model \
  --write-every-minutes 3 --log-every-seconds 60 --exp-name table1_reduced
