#!/usr/bin/env bash
# Segment 2: the Table 1 checkpoint (segment1/, 3,000 episodes per run) continued to 4,000 episodes per run
# (the traces restart at resume, as on any resume); SIGTERM after 16 min 40 s writes everything reached.
# Segment 1's checkpoint (segment1/td_lambda_tetris.pt, 5.1 MB) is in commit 525d392, not in the tree: taken from
# there into the git-ignored runs/.
cd "$(dirname "$0")"
ckpt=runs/segment1/td_lambda_tetris.pt
[ -f "$ckpt" ] || { mkdir -p runs/segment1 && git show 525d392:results/tetris_table1_reduced/segment1/td_lambda_tetris.pt \
  > "$ckpt.tmp" && mv "$ckpt.tmp" "$ckpt"; } || exit 1
OMP_NUM_THREADS=1 exec timeout -s TERM 1000 ../../.venv/bin/python ../../algos/td_lambda_tetris.py --network shallow \
  --activation dsilu sigmoid silu relu --num-runs 10 --total-episodes 4000 --reward-timing next --save-model \
  --resume "$ckpt" --write-every-minutes 3 --log-every-seconds 60 --exp-name table1_reduced_seg2
