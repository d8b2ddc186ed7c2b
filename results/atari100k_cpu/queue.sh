#!/usr/bin/env bash
# The README's Atari runs of rainbow_softmoe.py on the project CPU, one torch thread per run: DrQ(eps) and DER at the
# paper's 100k-step budget, the Nature-CNN baseline (--moe none) against Soft MoE with 4 experts (the network of the
# shipped DER.gin, which the issue asks for on a CPU; the paper's Fig. 12 uses Impala with 8); and full Rainbow at a
# reduced budget (300k agent steps), baseline against Soft MoE with 8 experts, on RoadRunner.
#
#   bash results/atari100k_cpu/queue.sh WORKER NUM_WORKERS     # e.g. "0 2" and "1 2", one per core
#   bash results/atari100k_cpu/queue.sh --list                 # the runs and their state
#   ONLY='_s2$' bash results/atari100k_cpu/queue.sh 0 2        # only the runs whose name matches a regex (--list too)
#   THREADS=2 bash results/atari100k_cpu/queue.sh 0 1          # one worker on both cores: one run finishes sooner
#
# Job i (of those ONLY selects) belongs to worker i % NUM_WORKERS. Resumable: a run whose summary.json says complete is
# skipped, a run with a checkpoint goes on from it (replay memory and priorities included, --checkpoint-replay),
# anything else starts afresh.
# Working files (checkpoints, replay memories: ~0.7 GB per run) stay in results/atari100k_cpu/work/ (git-ignored; they
# do not survive a fresh checkout, so only a run that finishes within one sitting lands);
# a finished run's summary, episodes, curve and log are copied to results/atari100k_cpu/<run>/, with the tensorboard
# scalars of all its segments as one scalars.csv (benchmark/scalars.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-$ROOT/.venv/bin/python}
OUT=$ROOT/results/atari100k_cpu
WORK=$OUT/work
# torch threads per run. Two one-thread workers did 1.4x the steps/s of one worker on two threads (threads/);
# THREADS=2 with one worker finishes a single run sooner (~39 against ~27 steps/s for the baseline early in a run)
export OMP_NUM_THREADS=${THREADS:-1}
# glibc: keep freed tensor memory in the heap instead of returning it to the OS and page-faulting it back on the next
# update (the experts' 8 MB activations); ~12% faster updates on this CPU, the same maths
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4000000000

jobs=()
for seed in 1 2 3; do
  for game in Breakout Boxing RoadRunner; do
    for moe in none softmoe; do jobs+=("drq-eps $game $moe $seed"); done
  done
  for moe in none softmoe; do jobs+=("der Boxing $moe $seed"); done
  # full Rainbow at a reduced budget (300k of the paper's 50M agent steps), Nature CNN, Soft MoE with 8 experts
  [ "$seed" = 1 ] && for moe in none softmoe; do jobs+=("full-rainbow RoadRunner $moe $seed"); done
done
selected=()  # ONLY=REGEX keeps the runs whose name matches, before they are shared out among the workers
for job in "${jobs[@]}"; do
  read -r agent game moe seed <<<"$job"
  [[ "${agent}_${game}_${moe}_s${seed}" =~ ${ONLY:-.} ]] && selected+=("$job")
done
jobs=("${selected[@]}")

latest() {  # latest() NAME FILE: that file of the newest run directory of NAME, or nothing
  ls -t "$WORK"/runs/*__"$1"__*/"$2" 2>/dev/null | head -n 1 || true
}

complete() {  # complete NAME: its committed copy or its newest working summary.json says complete
  local summary
  summary=$(latest "$1" summary.json)
  grep -qs '"complete": true' "$OUT/$1/summary.json" || { [ -n "$summary" ] && grep -q '"complete": true' "$summary"; }
}

if [ "${1:-}" = "--list" ]; then
  for job in "${jobs[@]}"; do
    read -r agent game moe seed <<<"$job"
    name="${agent}_${game}_${moe}_s${seed}"
    if complete "$name"; then state=complete
    elif [ -n "$(latest "$name" rainbow_softmoe.pt)" ]; then
      step=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['global_step'])" "$(latest "$name" summary.json)")
      state="checkpoint at step $step"
    else state="not started"; fi
    echo "$name: $state"
  done
  exit 0
fi

worker=${1:?usage: queue.sh WORKER NUM_WORKERS}
workers=${2:?usage: queue.sh WORKER NUM_WORKERS}
mkdir -p "$WORK/logs"
cd "$WORK"
for i in "${!jobs[@]}"; do
  [ $((i % workers)) = "$worker" ] || continue
  read -r agent game moe seed <<<"${jobs[$i]}"
  name="${agent}_${game}_${moe}_s${seed}"
  if complete "$name"; then echo "$name: complete"; continue; fi
  network=(--encoder nature --moe "$moe")
  if [ "$agent" = full-rainbow ]; then
    [ "$moe" = softmoe ] && network+=(--num-experts 8)
    network+=(--total-timesteps 300000)
  elif [ "$moe" = softmoe ]; then
    network+=(--num-experts 4)
  fi
  cmd=("$PY" "$ROOT/algos/rainbow_softmoe.py" --preset "$agent" --env-id "ALE/$game-v5" "${network[@]}" --seed "$seed"
       --exp-name "$name" --save-model --checkpoint-replay --write-every-minutes 10 --log-every-seconds 60)
  checkpoint=$(latest "$name" rainbow_softmoe.pt)
  [ -n "$checkpoint" ] && cmd+=(--resume "$checkpoint")
  echo "+ ${cmd[*]}" | tee -a "logs/$name.log"
  "${cmd[@]}" >>"logs/$name.log" 2>&1 || { echo "$name: exited with $? (see $WORK/logs/$name.log)"; exit 1; }
  if complete "$name"; then
    dir=$(dirname "$(latest "$name" summary.json)")
    mkdir -p "$OUT/$name"
    cp "$dir"/summary.json "$dir"/episodes.csv "$OUT/$name/"
    "$PY" "$ROOT/benchmark/learning_curve.py" "$dir" && cp "$dir"/learning_curve.png "$OUT/$name/"
    # every segment's tensorboard scalars: the run directories that left a checkpoint (one the queue resumed from, or
    # the last); an attempt stopped before its first checkpoint was started over, so its events are not the run's
    segments=()
    for checkpoint in "$WORK"/runs/*__"$name"__*/rainbow_softmoe.pt; do segments+=("$(dirname "$checkpoint")"); done
    "$PY" "$ROOT/benchmark/scalars.py" "${segments[@]}" --out "$OUT/$name/scalars.csv"
    cp "logs/$name.log" "$OUT/$name/train_log.txt"
    echo "$name: complete, copied to $OUT/$name"
  else
    echo "$name: stopped before the end; run the queue again to resume it"
    exit 0
  fi
done
