#!/usr/bin/env bash
# The chase's first candidate (README, "The chase"): ours with the reference's replay
# (ours_reference_replay.py: rainbow_softmoe.py --preset der with DER.gin's network and the reference's JAX ReplayBuffer
# fed as its agent feeds it; everything else ours, the atari100k protocol's 108,000-frame cut without a terminal
# included, so that the replay is the one thing changed), Breakout, seed 1, one arm per process pinned to a core, one
# torch thread. The code runs from a git worktree of one commit (work/code-<commit>, as
# the 26-game queue does), so edits to the checkout never reach a run in progress. Resumable: a checkpoint every 10
# minutes keeps the whole replay object (--checkpoint-replay), and a rerun goes on from the arm's latest.
#
#   DOPAMINE=../dopamine CORE=0 bash results/reference_training/run_ours_reference_replay.sh none      # or softmoe
#   CODE=<commit> ...   # the code of that commit (default 137126d6fb48: the 26-game experiment's, per-sample noise)
#
# Needs .refvenv (README: torch, gymnasium and ale-py beside JAX) and a checkout of google/dopamine at 5873f54. Runs
# land in work/ours_reference_replay/runs/ (git-ignored), logs in work/ours_reference_replay/<name>.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
moe=${1:?usage: run_ours_reference_replay.sh none|softmoe}
case "$moe" in none) network=(--moe none) ;; softmoe) network=(--moe softmoe --num-experts 4) ;;
  *) echo "unknown arm $moe (none or softmoe)"; exit 1 ;; esac
WORK=$ROOT/results/reference_training/work/ours_reference_replay
commit=$(git -C "$ROOT" rev-parse --short=12 "${CODE:-137126d6fb48}")
CODE_DIR=$WORK/code-$commit
mkdir -p "$WORK"
(
  flock 9
  [ -f "$CODE_DIR/results/reference_training/ours_reference_replay.py" ] ||
    git -C "$ROOT" worktree add --detach "$CODE_DIR" "$commit" >/dev/null
) 9>"$WORK/worktree.lock"
name=chase_Breakout_${moe}_s1
cmd=(taskset -c "${CORE:-0}" "$ROOT/.refvenv/bin/python" -W ignore "$CODE_DIR/results/reference_training/ours_reference_replay.py"
     --dopamine-dir "${DOPAMINE:?set DOPAMINE to a dopamine checkout}" --preset der --env-id ALE/Breakout-v5
     --encoder nature "${network[@]}" --seed 1
     --exp-name "$name" --save-model --checkpoint-replay --write-every-minutes 10 --log-every-seconds 60
     --snapshot-every 10000)
checkpoint=$(ls -t "$WORK"/runs/*__"$name"__*/rainbow_softmoe.pt 2>/dev/null | head -n 1 || true)
[ -n "$checkpoint" ] && cmd+=(--resume "$checkpoint")
cd "$WORK"
export OMP_NUM_THREADS=1 XLA_FLAGS=--xla_cpu_multi_thread_eigen=false
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4000000000  # as queue.sh
echo "+ ${cmd[*]}" >>"$name.log"
exec "${cmd[@]}" >>"$name.log" 2>&1
