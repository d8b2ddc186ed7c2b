"""Steps/s of a rainbow_softmoe.py log from its fifth progress line (15 s apart) to its last."""

import re
import sys

for f in sys.argv[1:]:
    steps = [int(m.group(1).replace(",", "")) for m in re.finditer(r"^step ([\d,]+)/", open(f).read(), re.M)]
    # log lines every 15 s: rate over lines 5..end (from ~75 s on, after learning starts at 1,600)
    a, b = steps[4], steps[-1]
    print(f, f"{(b - a) / (15 * (len(steps) - 1 - 4)):.1f} steps/s over {len(steps) - 5} intervals, from step {a}")
