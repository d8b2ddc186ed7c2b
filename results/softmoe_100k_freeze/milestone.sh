#!/usr/bin/env bash
# What a run in progress needs to go on from another machine, small enough to commit, in resume/<run>/:
#   state.pt + replay.npz   its latest checkpoint without the frames (benchmark/compact_checkpoint.py: queue.sh
#                           plays them again from the emulator and checks them before it resumes);
#   scalars.csv             the tensorboard scalars of its segments up to the checkpoint's step, routing statistics of
#                           the snapshots included;
#   segments.json           each segment's summary (steps, wall time);
#   train_log.txt           its log.
# Run it now and then while the queue runs (a checkpoint is written every 10 minutes) and commit resume/.
#
#   bash results/softmoe_100k_freeze/milestone.sh            # every run with a checkpoint that is not complete
#   ONLY='impala8_none_s1$' bash results/softmoe_100k_freeze/milestone.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-$ROOT/.venv/bin/python}
OUT=$ROOT/results/softmoe_100k_freeze
WORK=$OUT/work
export OMP_NUM_THREADS=1
shopt -s nullglob

for log in "$WORK"/logs/*.log; do
  name=$(basename "$log" .log)
  [[ "$name" =~ ${ONLY:-.} ]] || continue
  grep -qs '"complete": true' "$OUT/$name/summary.json" && continue
  checkpoint=$(ls -t "$WORK"/runs/*__"$name"__*/rainbow_softmoe.pt 2>/dev/null | head -n 1 || true)
  [ -n "$checkpoint" ] || continue
  dest=$OUT/resume/$name
  mkdir -p "$dest"
  "$PY" "$ROOT/benchmark/compact_checkpoint.py" pack "$checkpoint" "$dest" || continue
  step=$("$PY" -c 'import sys, torch; print(torch.load(sys.argv[1], weights_only=True)["global_step"])' "$dest/state.pt")
  segments=("$WORK"/runs/*__"$name"__*)
  for run in "${segments[@]}"; do
    if [ -d "$run/snapshots" ] && [ "$run/snapshots" -nt "$run/analysis.csv" ]; then
      "$PY" "$ROOT/benchmark/moe_analysis.py" "$run" >/dev/null
    fi
  done
  base=(); [ -f "$dest/scalars.csv" ] && base=(--base "$dest/scalars.csv")
  "$PY" "$ROOT/benchmark/scalars.py" "${segments[@]}" --out "$dest/scalars.csv.tmp" --upto "$step" "${base[@]}"
  mv "$dest/scalars.csv.tmp" "$dest/scalars.csv"
  "$PY" "$OUT/segments.py" "$dest/segments.json" "${segments[@]}"
  cp "$log" "$dest/train_log.txt"
done
