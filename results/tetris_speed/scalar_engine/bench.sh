# bench.sh: steady placements/s of the Tetris loop before (commit 7be9c61, checked out at $OLD) and after the scalar
# engine graph (NEW, default the checkout that holds this script; measured: commit 02ff3ee), alternating, the other
# core's Atari job paused (SIGSTOP) so both cores are free. Steady rate = placements between the third and the last
# progress line (10 s apart): no start-up, no compilation. The Python of this checkout's .venv runs both.
#   OLD=<checkout of 7be9c61> [NEW=<checkout>] bash results/tetris_speed/scalar_engine/bench.sh
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
OLD=$(cd "${OLD:?a checkout of commit 7be9c61}" && pwd) || exit 1
NEW=$(cd "${NEW:-$ROOT}" && pwd) || exit 1
OUT=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/bench_se && cd /tmp/bench_se
for cfg in "40 2 compile" "40 2 eager" "10 2 compile" "10 2 eager" "40 1 compile"; do
  for version in old new; do
    read -r runs threads mode <<<"$cfg"
    root=$NEW; [ $version = old ] && root=$OLD
    if [ "$runs" = 40 ]; then acts="dsilu sigmoid silu relu"; else acts="dsilu"; fi
    flag=""; [ "$mode" = compile ] && flag="--compile"
    secs=90; [ "$mode" = compile ] && secs=110
    log=$OUT/log_${version}_${runs}_${threads}_${mode}.txt
    OMP_NUM_THREADS=$threads timeout -s TERM $secs "$ROOT/.venv/bin/python" "$root/algos/td_lambda_tetris.py" \
      --activation $acts --num-runs 10 --total-episodes 100000 --log-every-seconds 10 --write-every-minutes 100 \
      --exp-name bench $flag > $log 2>&1
    python3 - "$log" "$version $cfg" <<'PY'
import re, sys
L = [l for l in open(sys.argv[1]) if l.startswith("episodes ")]
p = [int(re.search(r"placements ([\d,]+)", l).group(1).replace(",", "")) for l in L]
print(sys.argv[2], "lines", len(p), "steady placements/s ~", (p[-1] - p[2]) // (10 * (len(p) - 3)) if len(p) > 3 else None)
PY
  done
done
