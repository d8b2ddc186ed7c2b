#!/usr/bin/env bash
# The reference's seeds 2 and 3 on Breakout, both arms (README, "Seeds"), one run after another on one core:
# run_reference.sh with SEED=2, then 3, baseline before Soft MoE. Resumable: a rerun goes on from each run's latest
# checkpoint, and a finished run returns at once. A finished run keeps only its last replay checkpoint (the runner
# keeps four, ~2.4 GB each; the agent's checkpoints and train.py's copies at every 10,000 steps stay), so that four
# runs fit beside the 26-game queue on this disk.
#
#   DOPAMINE=../dopamine CORE=0 bash results/reference_training/run_reference_seeds.sh
#   AFTER=<pid> ...   # start once that process has ended (the chase's last run, holding the core)
set -euo pipefail
cd "$(dirname "$0")/../.."
while [ -n "${AFTER:-}" ] && kill -0 "$AFTER" 2>/dev/null; do sleep 60; done
for seed in 2 3; do
  for arm in baseline softmoe; do
    SEED=$seed CORE=${CORE:-0} bash results/reference_training/run_reference.sh "$arm"
    checkpoints=results/reference_training/work/dopamine_Breakout_${arm}_s$seed/checkpoints
    if [ -e "$checkpoints/sentinel_checkpoint_complete.49" ]; then  # the 50th 2,000-step iteration: finished
      for dir in $(ls "$checkpoints" | grep -E '^[0-9]+$'); do [ "$dir" = 49 ] || rm -rf "${checkpoints:?}/$dir"; done
    fi
  done
done
