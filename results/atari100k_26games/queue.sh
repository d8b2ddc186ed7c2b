#!/usr/bin/env bash
# §5.2's Atari-100k claim with DER (rainbow_softmoe.py --preset der), the network of the reference's shipped
# dopamine/labs/moes/configs/DER.gin (Nature CNN; Soft MoE with 4 experts) against its baseline (--moe none), one torch
# thread per run (THREADS=2: two, for one run alone on the machine), in this order:
#   1. Breakout, Boxing, RoadRunner, seeds 1-3 (seed 1 first: Breakout seed 1 is the run beside the reference's own
#      training, results/reference_training);
#   2. the other 23 games of the paper's 26 (Appendix A), seed 1.
#
#   bash results/atari100k_26games/queue.sh WORKER NUM_WORKERS   # e.g. "0 2" and "1 2", one per core
#   bash results/atari100k_26games/queue.sh --list                # each run's state
#   ONLY='_Breakout_' bash results/atari100k_26games/queue.sh 0 1  # only the runs whose name matches a regex
#   CODE=<commit> bash ...                                         # run the code of that commit (default: HEAD)
#   THREADS=2 ONLY='der_Breakout_softmoe_s1' bash ... 0 1          # one run alone on both cores (finishes in a session)
#
# Job i (of those ONLY selects) belongs to worker (i + i / NUM_WORKERS) % NUM_WORKERS, so that with two workers the
# baseline and Soft MoE runs alternate between them (a Soft MoE run takes ~1.3x a baseline's). The code runs from a git worktree of one commit
# (work/code-<commit>), so edits to the checkout never reach a run in progress; each segment's summary.json records its
# commit. Resumable: a run whose results/ copy exists is complete and skipped; a run with a checkpoint goes on from it
# (replay memory and priorities included). Working files (checkpoints, replay memories: ~0.7 GB per run, snapshots)
# stay in work/ (git-ignored); a run lost with the machine costs one run (7-9 h of a core here), so nothing is packed.
# A finished run's summary, episodes, learning curve, log, tensorboard scalars of all its segments (scalars.csv) and
# the routing statistics of its snapshots (analysis.csv, benchmark/moe_analysis.py) land in results/atari100k_26games/
# <run>/ and are committed on their own with runs.csv and aggregate.json (aggregate.py; `git commit -- <those
# paths>`). The snapshots of Breakout seed 1 are kept in work/ (the reference comparison reads them), and its Soft MoE
# run's probes are committed too (probes.npz, probes.py: the comparison's routing look once a fresh machine has lost
# the snapshots); the others, and every finished run's replay memory, are deleted.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-$ROOT/.venv/bin/python}
OUT=$ROOT/results/atari100k_26games
WORK=$OUT/work
export OMP_NUM_THREADS=${THREADS:-1}
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4000000000  # keep freed activations in the heap

GAMES_26="Alien Amidar Assault Asterix BankHeist BattleZone Boxing Breakout ChopperCommand CrazyClimber DemonAttack
  Freeway Frostbite Gopher Hero Jamesbond Kangaroo Krull KungFuMaster MsPacman Pong PrivateEye Qbert RoadRunner
  Seaquest UpNDown"
THREE="Breakout Boxing RoadRunner"
jobs=()
for seed in 1 2 3; do
  for game in $THREE; do for moe in none softmoe; do jobs+=("$game $moe $seed"); done; done
done
for game in $GAMES_26; do
  [[ " $THREE " == *" $game "* ]] && continue
  for moe in none softmoe; do jobs+=("$game $moe 1"); done
done
selected=()
for job in "${jobs[@]}"; do
  read -r game moe seed <<<"$job"
  [[ "der_${game}_${moe}_s${seed}" =~ ${ONLY:-.} ]] && selected+=("$job")
done
jobs=("${selected[@]}")

latest() { ls -t "$WORK"/runs/*__"$1"__*/"$2" 2>/dev/null | head -n 1 || true; }
complete() { grep -qs '"complete": true' "$OUT/$1/summary.json"; }

if [ "${1:-}" = --list ]; then
  for job in "${jobs[@]}"; do
    read -r game moe seed <<<"$job"
    name="der_${game}_${moe}_s${seed}"
    if complete "$name"; then echo "$name: complete"
    elif [ -n "$(latest "$name" summary.json)" ]; then
      echo "$name: at step $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["global_step"])' \
        "$(latest "$name" summary.json)")"
    else echo "$name: not started"; fi
  done
  exit 0
fi

worker=${1:?usage: queue.sh WORKER NUM_WORKERS}
workers=${2:?usage: queue.sh WORKER NUM_WORKERS}
commit=$(git -C "$ROOT" rev-parse --short=12 "${CODE:-HEAD}")
CODE_DIR=$WORK/code-$commit
mkdir -p "$WORK/logs"
(  # two workers may start together: one makes the worktree, the other waits for the lock and finds it there
  flock 9
  [ -f "$CODE_DIR/algos/rainbow_softmoe.py" ] || git -C "$ROOT" worktree add --detach "$CODE_DIR" "$commit" >/dev/null
) 9>"$WORK/worktree.lock"
[ -f "$CODE_DIR/algos/rainbow_softmoe.py" ] || { echo "no worktree at $CODE_DIR"; exit 1; }

commit_results() {  # commit_results MESSAGE PATH...: those paths alone, retried while another git command holds the lock
  local message=$1; shift
  for _ in 1 2 3 4 5 6; do
    git -C "$ROOT" add -- "$@" && git -C "$ROOT" commit -q -m "$message" -- "$@" && return 0
    sleep 20
  done
  echo "could not commit; commit $* by hand"
}

cd "$WORK"
for i in "${!jobs[@]}"; do
  [ $(((i + i / workers) % workers)) = "$worker" ] || continue
  read -r game moe seed <<<"${jobs[$i]}"
  name="der_${game}_${moe}_s${seed}"
  complete "$name" && continue
  network=(--encoder nature --moe "$moe")
  [ "$moe" = softmoe ] && network+=(--num-experts 4)
  snapshots=(--snapshot-every 10000)  # the preset's: routing statistics once per iteration
  cmd=("$PY" "$CODE_DIR/algos/rainbow_softmoe.py" --preset der --env-id "ALE/$game-v5" "${network[@]}" --seed "$seed"
       --exp-name "$name" --save-model --checkpoint-replay --write-every-minutes 10 --log-every-seconds 60
       "${snapshots[@]}" ${EXTRA:-})
  checkpoint=$(latest "$name" rainbow_softmoe.pt)
  [ -n "$checkpoint" ] && cmd+=(--resume "$checkpoint")
  echo "+ OMP_NUM_THREADS=$OMP_NUM_THREADS ${cmd[*]}" >>"logs/$name.log"
  "${cmd[@]}" >>"logs/$name.log" 2>&1 || { echo "$name: exited with $? (see $WORK/logs/$name.log)"; exit 1; }
  summary=$(latest "$name" summary.json)
  if ! grep -q '"complete": true' "$summary"; then
    echo "$name: stopped before the end; run the queue again to resume it"; exit 0
  fi
  dir=$(dirname "$summary")
  segments=("$WORK"/runs/*__"$name"__*)
  mkdir -p "$OUT/$name"
  cp "$dir/episodes.csv" "$OUT/$name/"
  cp "logs/$name.log" "$OUT/$name/train_log.txt"
  "$PY" "$CODE_DIR/benchmark/learning_curve.py" "$dir" && cp "$dir/learning_curve.png" "$OUT/$name/"
  # the checkout's scalars.py: it drops what a segment logged past the step the next one resumed from (32aa045's kept it)
  "$PY" "$ROOT/benchmark/scalars.py" "${segments[@]}" --out "$OUT/$name/scalars.csv"
  for run in "${segments[@]}"; do
    [ -d "$run/snapshots" ] || continue
    "$PY" "$CODE_DIR/benchmark/moe_analysis.py" "$run" >/dev/null
    cat "$run/analysis.csv" >>"$OUT/$name/analysis.csv.tmp"
  done
  [ -f "$OUT/$name/analysis.csv.tmp" ] && awk 'NR == 1 || $0 != first { print } NR == 1 { first = $0 }' \
    "$OUT/$name/analysis.csv.tmp" >"$OUT/$name/analysis.csv" && rm "$OUT/$name/analysis.csv.tmp"
  if [ "$game $moe $seed" = "Breakout softmoe 1" ]; then
    "$PY" "$ROOT/results/atari100k_26games/probes.py" "$OUT/$name/probes.npz" "${segments[@]}"
  fi
  "$PY" "$ROOT/results/softmoe_100k_freeze/segments.py" "$OUT/$name/segments.json" "${segments[@]}"
  cp "$summary" "$OUT/$name/"  # last: the run counts as complete once everything else is here
  for run in "${segments[@]}"; do  # disk: the replay memories go, and the snapshots but Breakout seed 1's
    rm -f "$run"/rainbow_softmoe_replay_*.npz
    [ "$game $seed" = "Breakout 1" ] || rm -rf "$run/snapshots"
  done
  result=$("$PY" -c 'import json, sys; s = json.load(open(sys.argv[1]))
print("{:,} agent steps; evaluation {:.1f}".format(s["global_step"], s["eval_mean_return"]))' "$summary")
  "$PY" "$ROOT/results/atari100k_26games/aggregate.py" ||  # runs.csv and aggregate.json, with this run's row
    echo "$name: aggregate.py failed; rerun it and commit runs.csv and aggregate.json by hand"
  commit_results "atari100k_26games: $name complete ($result)" "$OUT/$name" "$OUT/runs.csv" "$OUT/aggregate.json"
  echo "$name: complete, in $OUT/$name"
done
