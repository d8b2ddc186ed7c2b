#!/usr/bin/env bash
# Fig. 4 at a reduced budget: shallow dSiLU (250 hidden units, reward exp(-holes/16.5): the env's defaults) on 10x10
# Tetris, 5 runs batched, one thread, --compile, reward r(s_{t+1}) (the default when it ran). The paper trains 400,000 episodes per run; this stops after
# ${SECONDS_BUDGET:-1800} s (SIGTERM writes everything reached). Resumable: a second call continues from the checkpoint.
cd "$(dirname "$0")"
ckpt=$(ls -t runs/*__tetris10x10_reduced__*/td_lambda_tetris.pt 2>/dev/null | head -n 1)
OMP_NUM_THREADS=1 exec timeout -s TERM "${SECONDS_BUDGET:-1800}" ../../.venv/bin/python ../../algos/td_lambda_tetris.py \
  --env-id envs/Tetris10x10-v0 --activation dsilu --num-runs 5 --total-episodes 400000 --reward-timing next --compile --save-model \
  --write-every-minutes 3 --log-every-seconds 60 --exp-name tetris10x10_reduced ${ckpt:+--resume "$ckpt"}
