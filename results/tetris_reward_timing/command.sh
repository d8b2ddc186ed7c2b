#!/usr/bin/env bash
# Reward timing (issue 11 §1.4): the same 10 dSiLU runs (seed 1: run i from seed + i, the same piece and choice
# generator) with r(s_{t+1}) ('next', tetris.md §0) and with the literal r_t = r(s_t) ('current'), one thread each,
# one after the other. Reduced budget: 3,000 episodes per run (the issue asks for at least 5,000).
cd "$(dirname "$0")"
for timing in next current; do
  OMP_NUM_THREADS=1 ../../.venv/bin/python ../../algos/td_lambda_tetris.py --activation dsilu --num-runs 10 \
    --total-episodes "${EPISODES:-3000}" --reward-timing "$timing" --write-every-minutes 3 --log-every-seconds 60 \
    --exp-name "reward_$timing" > "train_log_$timing.txt" 2>&1
done
