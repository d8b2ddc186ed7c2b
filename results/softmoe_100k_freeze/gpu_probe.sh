#!/usr/bin/env bash
# Sizing the device part of this study (the 100k comparison on many games): agent steps/s of DrQ(eps) with the paper's
# network (Impala, Soft MoE with 8 experts) on a lent GPU, `--cuda-graph`, first one process alone, then four at once
# (Breakout, Pong, Boxing, Seaquest). Run from the repository root on the GPU machine, with the wheels in .whl/.
set -uo pipefail
ROOT=$PWD OUT=${OUT:-/tmp/out} W=/tmp/probe
mkdir -p "$OUT" "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done; }
drq() {  # name seconds game
  (cd "$W" && timeout -s INT "$2" python3 "$ROOT/algos/rainbow_softmoe.py" --preset drq-eps --env-id "ALE/$3-v5" \
     --encoder impala --moe softmoe --num-experts 8 --device cuda ${GRAPH---cuda-graph} --log-every-seconds 5 \
     --exp-name "$1" 2>&1 | stamp > "$W/$1.log")
}
drq alone_Breakout "${ALONE_SECONDS:-60}" Breakout
grep -q "updates [1-9]" "$W/alone_Breakout.log" || GRAPH=""  # the graphs failed: measure eager
for game in Breakout Pong Boxing Seaquest; do drq "four_$game" "${FOUR_SECONDS:-70}" "$game" & done
wait
for f in "$W"/*.log; do echo "== $(basename "$f")"; grep -E "step [0-9,]+/" "$f" | tail -n 2; grep -m1 -E "Error|error" "$f"; done
cp "$W"/*.log "$OUT"/ 2>/dev/null
