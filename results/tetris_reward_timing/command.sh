#!/usr/bin/env bash
# Reward timing (issue 11 §1.4): the same 10 dSiLU runs (seed 1: run i from seed + i, the same piece and choice
# generator) with r(s_{t+1}) ('next', this project's first reading) and with the literal r_t = r(s_t) ('current'), one thread each,
# one after the other (or `command.sh next & command.sh current` on two threads). Reduced budget: 5,000 episodes
# per run (EPISODES to change it). Resumable: a second call continues each timing from its checkpoint in runs/.
cd "$(dirname "$0")"
for timing in ${@:-next current}; do
  ckpt=$(ls -t runs/*__reward5k_"$timing"__*/td_lambda_tetris.pt 2>/dev/null | head -n 1)
  OMP_NUM_THREADS=1 ../../.venv/bin/python ../../algos/td_lambda_tetris.py --activation dsilu --num-runs 10 \
    --total-episodes "${EPISODES:-5000}" --reward-timing "$timing" --compile --save-model --write-every-minutes 3 \
    --log-every-seconds 60 --exp-name "reward5k_$timing" ${ckpt:+--resume "$ckpt"} >> "train_log_5k_$timing.txt" 2>&1
done
