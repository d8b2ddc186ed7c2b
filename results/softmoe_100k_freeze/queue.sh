#!/usr/bin/env bash
# DrQ(eps) on Breakout at the paper's 100k budget, one torch thread per run:
#   impala8_*: the paper's network (Impala encoder, Soft MoE with 8 experts, Fig. 12) against the Impala baseline;
#   normalize_*, phieps_*: the Nature CNN with 4 experts (DER.gin's network) with --moe-normalize, or with Adam's eps
#   for Phi alone at 1e-8 (--phi-adam-eps), the two candidate causes of the frozen routing;
#   nature4_softmoe_s1, nature_none_s1: that network unchanged, and its baseline, under this study's no-op starts
#   (the earlier runs they are compared with had emulator-frame no-ops);
#   normalize_softmoe_s3: a third seed, as its first two disagree (evaluation 15.0 and 38.1).
#   nature4_softmoe_s2, nature_none_s2: a second seed of the two controls, after the Impala runs.
#   impala8_softmoe_s3, impala8_none_s3: a third seed of the Impala pair, so that both compared pairs have three seeds
#   (the --moe-normalize arm got its third because its first two disagreed).
# Order: the Nature runs (~2.5-5 h each on one core), the Impala runs (~3.5-4 h each on one core, about 7 minutes on a
# lent H200: device.sh), then the controls' second seed.
#
#   bash results/softmoe_100k_freeze/queue.sh            # every run not yet complete, in order
#   ONLY='impala8_softmoe_s1$' bash results/softmoe_100k_freeze/queue.sh
#   bash results/softmoe_100k_freeze/queue.sh --list
#   bash results/softmoe_100k_freeze/queue.sh --milestone   # pack every run in progress into resume/<run>/, to commit
#   EXTRA="--device cuda --cuda-graph" bash results/softmoe_100k_freeze/queue.sh   # flags added to every run
#
# Resumable: a run with a checkpoint goes on from it (replay memory included). Working files stay in work/ (git-ignored,
# ~0.7 GB per run; lost with a fresh checkout). --milestone packs each run in progress into resume/<run>/, small
# enough to commit: its latest checkpoint without the frames (state.pt, replay.npz: benchmark/compact_checkpoint.py),
# its scalars up to that step (routing statistics of the snapshots included), its segments' summaries (steps, wall
# time) and its log. On a machine without the run's checkpoint, or with an older one, the queue unpacks the pack (the
# frames played again from the emulator and checked) and resumes from it. A complete run's summary, episodes, curve,
# log, scalars (CSV) and segments' summaries are copied to results/softmoe_100k_freeze/<run>/, and its resume/<run>/
# is removed.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-$ROOT/.venv/bin/python}
OUT=$ROOT/results/softmoe_100k_freeze
WORK=$OUT/work
export OMP_NUM_THREADS=${THREADS:-1}
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4000000000  # keep freed activations in the heap

jobs=(
  "normalize_softmoe_s1|--encoder nature --moe softmoe --num-experts 4 --moe-normalize --seed 1"
  "phieps_softmoe_s1|--encoder nature --moe softmoe --num-experts 4 --phi-adam-eps 1e-8 --seed 1"
  "normalize_softmoe_s2|--encoder nature --moe softmoe --num-experts 4 --moe-normalize --seed 2"
  "phieps_softmoe_s2|--encoder nature --moe softmoe --num-experts 4 --phi-adam-eps 1e-8 --seed 2"
  "nature4_softmoe_s1|--encoder nature --moe softmoe --num-experts 4 --seed 1"
  "nature_none_s1|--encoder nature --moe none --seed 1"
  "normalize_softmoe_s3|--encoder nature --moe softmoe --num-experts 4 --moe-normalize --seed 3"
  "impala8_softmoe_s1|--encoder impala --moe softmoe --num-experts 8 --seed 1"
  "impala8_none_s1|--encoder impala --moe none --seed 1"
  "impala8_softmoe_s2|--encoder impala --moe softmoe --num-experts 8 --seed 2"
  "impala8_none_s2|--encoder impala --moe none --seed 2"
  "nature4_softmoe_s2|--encoder nature --moe softmoe --num-experts 4 --seed 2"
  "nature_none_s2|--encoder nature --moe none --seed 2"
  "impala8_softmoe_s3|--encoder impala --moe softmoe --num-experts 8 --seed 3"
  "impala8_none_s3|--encoder impala --moe none --seed 3"
)

latest() { ls -t "$WORK"/runs/*__"$1"__*/"$2" 2>/dev/null | head -n 1 || true; }
step_of() { "$PY" -c 'import sys, torch; print(torch.load(sys.argv[1], weights_only=True)["global_step"])' "$1"; }
complete() { grep -qs '"complete": true' "$OUT/$1/summary.json"; }
collect() {  # scalars and segments' summaries of run $1 into $2, over those of earlier machines (scalars.py flags: $3...)
  local name=$1 dest=$2 run base=(); shift 2
  local segments=("$WORK"/runs/*__"$name"__*)
  for run in "${segments[@]}"; do  # Fig. 10's statistics from the snapshots
    if [ -d "$run/snapshots" ] && [ "$run/snapshots" -nt "$run/analysis.csv" ]; then
      "$PY" "$ROOT/benchmark/moe_analysis.py" "$run" >/dev/null
    fi
  done
  [ -f "$OUT/resume/$name/scalars.csv" ] && base=(--base "$OUT/resume/$name/scalars.csv")
  "$PY" "$ROOT/benchmark/scalars.py" "${segments[@]}" --out "$dest/scalars.csv.tmp" "$@" "${base[@]}"
  mv "$dest/scalars.csv.tmp" "$dest/scalars.csv"
  "$PY" "$OUT/segments.py" "$dest/segments.json" "${segments[@]}"
}

mkdir -p "$WORK/logs"
for job in "${jobs[@]}"; do
  name=${job%%|*}; flags=${job#*|}
  [[ "$name" =~ ${ONLY:-.} ]] || continue
  if [ "${1:-}" = --list ]; then
    if complete "$name"; then echo "$name: complete"
    elif [ -n "$(latest "$name" rainbow_softmoe.pt)" ]; then echo "$name: checkpoint $(latest "$name" rainbow_softmoe.pt)"
    elif [ -f "$OUT/resume/$name/state.pt" ]; then echo "$name: packed in resume/$name (unpacked when it runs)"
    else echo "$name: not started"; fi
    continue
  fi
  complete "$name" && continue
  if [ "${1:-}" = --milestone ]; then
    checkpoint=$(latest "$name" rainbow_softmoe.pt)
    [ -n "$checkpoint" ] || continue
    mkdir -p "$OUT/resume/$name"
    "$PY" "$ROOT/benchmark/compact_checkpoint.py" pack "$checkpoint" "$OUT/resume/$name" || continue
    collect "$name" "$OUT/resume/$name" --upto "$(step_of "$OUT/resume/$name/state.pt")"
    cp "$WORK/logs/$name.log" "$OUT/resume/$name/train_log.txt"
    continue
  fi
  have=$(latest "$name" rainbow_softmoe.pt)
  if [ -f "$OUT/resume/$name/state.pt" ] && { [ -z "$have" ] ||
      [ "$(step_of "$OUT/resume/$name/state.pt")" -gt "$(step_of "$have")" ]; }; then  # the pack is further along
    "$PY" "$ROOT/benchmark/compact_checkpoint.py" unpack "$OUT/resume/$name" \
      "$WORK/runs/Breakout__${name}__restored_$(date +%s)/rainbow_softmoe.pt"
    cp "$OUT/resume/$name/train_log.txt" "$WORK/logs/$name.log"
  fi
  # shellcheck disable=SC2206
  cmd=("$PY" "$ROOT/algos/rainbow_softmoe.py" --preset drq-eps --env-id ALE/Breakout-v5 $flags --exp-name "$name"
       --save-model --checkpoint-replay --write-every-minutes 10 --log-every-seconds 60 ${EXTRA:-})
  checkpoint=$(latest "$name" rainbow_softmoe.pt)
  [ -n "$checkpoint" ] && cmd+=(--resume "$checkpoint")
  (cd "$WORK" && echo "+ ${cmd[*]}" >>"logs/$name.log" && "${cmd[@]}" >>"logs/$name.log" 2>&1)
  summary=$(latest "$name" summary.json)
  if grep -q '"complete": true' "$summary"; then
    mkdir -p "$OUT/$name"
    cp "$(dirname "$summary")/episodes.csv" "$OUT/$name/"
    cp "$WORK/logs/$name.log" "$OUT/$name/train_log.txt"
    "$PY" "$ROOT/benchmark/learning_curve.py" "$(dirname "$summary")" && cp "$(dirname "$summary")/learning_curve.png" "$OUT/$name/"
    [ -f "$OUT/resume/$name/segments.json" ] && cp "$OUT/resume/$name/segments.json" "$OUT/$name/"
    collect "$name" "$OUT/$name"
    cp "$summary" "$OUT/$name/"  # last: the run counts as complete once everything else is here
    rm -rf "$OUT/resume/$name"
  else
    echo "$name: stopped before the end; run the queue again to resume it"; exit 0
  fi
done
