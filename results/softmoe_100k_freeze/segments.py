"""Each segment's summary (start and end step, updates, wall time, steps/s), merged into a JSON file that keeps the
segments of earlier machines: python segments.py OUT.json runs/<segment> [runs/<segment> ...]"""

import json
import os
import sys

out, runs = sys.argv[1], sys.argv[2:]
segments = json.load(open(out)) if os.path.exists(out) else {}
for run in runs:
    if os.path.exists(path := os.path.join(run, "summary.json")):
        summary = json.load(open(path))
        keep = ("start_step", "global_step", "updates", "wall_time", "sps")
        segments[os.path.basename(run)] = {key: summary.get(key) for key in keep}
with open(out, "w") as f:
    json.dump(segments, f, indent=1)
