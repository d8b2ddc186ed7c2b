#!/usr/bin/env bash
# Table 3 and Fig. 6 on the best of the 10 dSiLU runs at 200,000 episodes (--run best: the highest mean over its final
# 1,000 training episodes), 1,000 episodes per selection rule (64 games at once), no learning; the value analysis on
# the first rule's (softmax at the final tau) 1,000 episodes. The 200k checkpoint (~110 MB) is not committed:
#   python ../milestone.py unpack ../state.npz ../final.pt
# rebuilds one whose parameters are the run's final ones (its per-episode history inside the summed blocks is lost,
# but the final 1,000 episodes that pick the best run are kept raw).
#   bash command.sh [CHECKPOINT] [tetris_eval.py flags]   # writes runs/<run>__eval__<time>/ here, or --out DIR
# The files beside this script were written with --out . (tetris_eval.py refuses a folder that holds a summary.json).
cd "$(dirname "$0")"
CKPT=${1:-../final.pt}
shift
OMP_NUM_THREADS=1 ../../../.venv/bin/python ../../../benchmark/tetris_eval.py --checkpoint "$CKPT" \
  --activation dsilu --run best "$@"
