#!/usr/bin/env bash
# Table 3 and Fig. 6 on the best of the 10 dSiLU runs of the 20k checkpoint (--run best: highest mean over its last
# 1,000 training episodes), 1,000 episodes per selection rule (64 games at once), no learning; the value analysis on
# the first rule's 1,000 episodes. The checkpoint records no reward timing, so benchmark/tetris_eval.py evaluates it
# with r(s_{t+1}) ('next'), the one it trained with. Writes runs/<run>__eval__<time>/ here; further flags go to
# tetris_eval.py (--out DIR; --episodes 10 --value-analysis-episodes 10 for a short check). ~8 min on one shared core.
# The files beside this script came from the evaluation inside td_lambda_tetris.py (commit 4f76feb), which moved to
# benchmark/tetris_eval.py in 0c0d245 (the same numbers for the same checkpoint and seed):
#   td_lambda_tetris.py --load-model ../td_lambda_tetris.pt --num-runs 10 --total-episodes 0 --eval-episodes 1000 \
#     --eval-run best --value-analysis-episodes 1000 --reward-timing next --exp-name table3_best_20k
cd "$(dirname "$0")"
OMP_NUM_THREADS=1 ../../../.venv/bin/python ../../../benchmark/tetris_eval.py --checkpoint ../td_lambda_tetris.pt \
  --run best --episodes 1000 --value-analysis-episodes 1000 "$@"
