#!/usr/bin/env bash
# The README's offline results (issue 10), reduced budget, on the project CPU with one torch thread: CQL with the
# Nature CNN, the dense baseline (--moe none) against Soft MoE with 8 experts, seeds 1 and 2, on the Breakout dataset
# that make_dataset.sh writes (500k transitions of a learning DQN, 100% of it). The paper (Fig. 11) uses Impala, 5% /
# 10% / 50% of a 50M-step DQN Replay Dataset run and 200 iterations of 62,500 gradient steps; this is
# $ITERATIONS x $STEPS gradient steps, each iteration followed by 8 evaluation games at epsilon 0.001 capped at 18k
# frames (Dopamine's cap is 108k: a policy that never serves in Breakout would hold the CPU for 27k agent steps).
#
#   bash results/cql_cpu/make_dataset.sh && bash results/cql_cpu/queue.sh      # resumable: run again after a stop
#   bash results/cql_cpu/queue.sh 0 2 & bash results/cql_cpu/queue.sh 1 2       # two workers (job i: worker i % 2)
#   bash results/cql_cpu/queue.sh --list
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-$ROOT/.venv/bin/python}
OUT=$ROOT/results/cql_cpu
WORK=$OUT/work
ITERATIONS=${ITERATIONS:-5}
STEPS=${STEPS:-1000}
export OMP_NUM_THREADS=1

jobs=()
for seed in 1 2; do
  for moe in none softmoe; do jobs+=("cql $moe $seed"); done
done

latest() {  # latest NAME FILE: that file of the newest run directory of NAME, or nothing
  ls -t "$WORK"/runs/*__"$1"__*/"$2" 2>/dev/null | head -n 1 || true
}

complete() {  # complete NAME: its newest summary.json says complete
  local summary
  summary=$(latest "$1" summary.json)
  [ -n "$summary" ] && grep -q '"complete": true' "$summary"
}

if [ "${1:-}" = "--list" ]; then
  for job in "${jobs[@]}"; do
    read -r agent moe seed <<<"$job"
    name="${agent}_Breakout_${moe}_s${seed}"
    if complete "$name"; then state=complete
    elif [ -n "$(latest "$name" cql_softmoe.pt)" ]; then state="checkpoint"
    else state="not started"; fi
    echo "$name: $state"
  done
  exit 0
fi

worker=${1:-0}
workers=${2:-1}
mkdir -p "$WORK/logs"
cd "$WORK"
[ -f dataset/behaviour_episodes.csv ] || { echo "error: no dataset in $WORK/dataset; run results/cql_cpu/make_dataset.sh first"; exit 1; }
for i in "${!jobs[@]}"; do
  [ $((i % workers)) = "$worker" ] || continue
  read -r agent moe seed <<<"${jobs[$i]}"
  name="${agent}_Breakout_${moe}_s${seed}"
  if complete "$name"; then echo "$name: complete"; continue; fi
  network=(--encoder nature --moe "$moe")
  [ "$moe" = softmoe ] && network+=(--num-experts 8)
  cmd=("$PY" "$ROOT/algos/cql_softmoe.py" --agent "$agent" --env-id ALE/Breakout-v5 --dataset-dir dataset
       --data-percent 100 "${network[@]}" --seed "$seed" --num-iterations "$ITERATIONS" --steps-per-iteration "$STEPS"
       --eval-episodes 8 --max-episode-frames 18000 --exp-name "$name" --save-model --write-every-minutes 10 --log-every-seconds 60)
  checkpoint=$(latest "$name" cql_softmoe.pt)
  [ -n "$checkpoint" ] && cmd+=(--resume "$checkpoint")
  echo "+ ${cmd[*]}" | tee -a "logs/$name.log"
  "${cmd[@]}" >>"logs/$name.log" 2>&1 || { echo "$name: exited with $? (see $WORK/logs/$name.log)"; exit 1; }
  if complete "$name"; then
    dir=$(dirname "$(latest "$name" summary.json)")
    mkdir -p "$OUT/$name"
    cp "$dir"/summary.json "$dir"/eval_curve.csv "$dir"/eval_curve.png "$OUT/$name/"
    "$PY" "$ROOT/benchmark/scalars.py" "$dir" --out "$OUT/$name/scalars.csv"
    cp "logs/$name.log" "$OUT/$name/train_log.txt"
    echo "$name: complete, copied to $OUT/$name"
  else
    echo "$name: stopped before the end; run the queue again to resume it"
    exit 0
  fi
done
