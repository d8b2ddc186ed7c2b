#!/usr/bin/env bash
# Table 3 and Fig. 6 on the best of the 10 dSiLU runs of the 20k checkpoint (--eval-run best: highest mean over its
# last 1,000 training episodes), 1,000 episodes per selection rule (64 games at once), no learning. The checkpoint was
# trained with the reward r(s_{t+1}), so the value analysis passes --reward-timing next. ~8 min on one shared core.
cd "$(dirname "$0")"
OMP_NUM_THREADS=1 ../../../.venv/bin/python ../../../algos/td_lambda_tetris.py --load-model ../td_lambda_tetris.pt \
  --num-runs 10 --total-episodes 0 --eval-episodes 1000 --eval-run best --value-analysis-episodes 1000 \
  --reward-timing next --exp-name table3_best_20k
