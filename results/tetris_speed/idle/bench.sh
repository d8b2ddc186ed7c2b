# bench.sh: steady placements/s (between the first and the last progress line, 10 s apart) of the Tetris loop, idle machine
# CODE: the checkout whose algos/td_lambda_tetris.py runs (default the one that holds this script; the logs here are
# commit 53473b2's); the logs and the runs' folders go to the current directory.
#   mkdir -p /tmp/idle && cd /tmp/idle && [CODE=<checkout>] bash <repository>/results/tetris_speed/idle/bench.sh
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
CODE=$(cd "${CODE:-$ROOT}" && pwd) || exit 1
for cfg in "40 2 compile" "40 2 eager" "10 2 compile" "10 2 eager" "40 1 compile" "10 1 compile"; do
  read -r runs threads mode <<<"$cfg"
  if [ "$runs" = 40 ]; then acts="dsilu sigmoid silu relu"; n=10; else acts="dsilu"; n=10; fi
  flag=""; [ "$mode" = compile ] && flag="--compile"
  secs=70; [ "$mode" = compile ] && secs=110
  log=log_${runs}_${threads}_${mode}.txt
  OMP_NUM_THREADS=$threads timeout -s TERM $secs "$ROOT/.venv/bin/python" "$CODE/algos/td_lambda_tetris.py" \
    --activation $acts --num-runs $n --total-episodes 2000 --log-every-seconds 10 --write-every-minutes 100 \
    --exp-name bench $flag > $log 2>&1
  python3 - "$log" "$cfg" <<'PY'
import re, sys
L = [l for l in open(sys.argv[1]) if l.startswith("episodes ")]
p = [int(re.search(r"placements ([\d,]+)", l).group(1).replace(",", "")) for l in L]
# the lines are >= 10 s apart (a line prints at the first step after 10 s): rate over the steady lines after the first
print(sys.argv[2], "lines", len(p), "steady placements/s ~", (p[-1] - p[1]) // (10 * (len(p) - 2)) if len(p) > 2 else None)
PY
done
