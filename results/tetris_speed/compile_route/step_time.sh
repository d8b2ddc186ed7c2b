#!/usr/bin/env bash
# step_time.py for both routes, alternating, twice, at 10 and 40 runs, with the given PIDs paused (continued on exit).
#   bash step_time.sh OLD_TREE PUB_TREE [PIDS_TO_PAUSE...] > step_time.txt
set -u
OLD=$1 PUB=$2; shift 2
PIDS="$*"
PY=${PY:-$(cd "$(dirname "$0")/../../.." && pwd)/.venv/bin/python}
HERE=$(cd "$(dirname "$0")" && pwd)
resume() { for p in $PIDS; do kill -CONT "$p" 2>/dev/null; done; }
trap resume EXIT INT TERM
for p in $PIDS; do kill -STOP "$p"; done
echo "# $(date -u +%FT%TZ) load: $(cat /proc/loadavg)"
for rep in 1 2; do
  for R in 10 40; do
    ROUTE=old "$PY" "$HERE/step_time.py" "$OLD" "$R" 2>&1 | tail -1
    ROUTE=pub PUB=flat PUB_ISO=1 "$PY" "$HERE/step_time.py" "$PUB" "$R" 2>&1 | tail -1
  done
done
