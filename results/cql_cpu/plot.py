"""The CQL results figure: evaluation score per iteration of every run in results/cql_cpu/, one colour per network,
with the behaviour policy's score (the generating DQN's last 100 training episodes) as a line.

    .venv/bin/python results/cql_cpu/plot.py      # writes results/cql_cpu/eval_curves.png and summary.json
"""

import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

HERE = Path(__file__).parent
runs = sorted(p for p in HERE.iterdir() if (p / "eval_curve.csv").is_file())
fig, ax = plt.subplots(figsize=(7, 4.5))
colours = {"none": "tab:blue", "softmoe": "tab:red"}
table, behaviour = {}, None
for run in runs:
    summary = json.loads((run / "summary.json").read_text())
    with open(run / "eval_curve.csv") as f:
        rows = list(csv.DictReader(f))
    steps = [int(r["gradient_steps"]) for r in rows]
    scores = [float(r["mean_return"]) for r in rows]
    moe = summary["args"]["moe"]
    label = {"none": "CQL, dense baseline", "softmoe": "CQL, Soft MoE (8 experts)"}[moe]
    ax.plot(steps, scores, "o-", color=colours[moe], alpha=0.8, label=label if moe not in table else None)
    table.setdefault(moe, []).append({"run": run.name, "seed": summary["args"]["seed"], "final": scores[-1],
                                      "curve": scores, "gradient_steps_per_second":
                                      summary.get("gradient_steps_per_second")})  # fmt: skip
    behaviour = summary.get("behaviour_policy") or behaviour
if behaviour:
    ax.axhline(behaviour["mean_return_last_100"], color="k", ls="--", label="behaviour policy (last 100 episodes)")
ax.set_xlabel("gradient steps")
ax.set_ylabel("evaluation return (8 games, epsilon 0.001)")
ax.set_title("Offline CQL on a 500k-transition Breakout dataset (reduced budget, CPU)")
ax.legend()
fig.tight_layout()
fig.savefig(HERE / "eval_curves.png", dpi=120)
out = {moe: {"runs": rows, "final_mean_over_seeds": float(np.mean([r["final"] for r in rows]))}
       for moe, rows in table.items()}  # fmt: skip
out["behaviour_policy"] = behaviour
(HERE / "summary.json").write_text(json.dumps(out, indent=2) + "\n")
print(json.dumps({k: v.get("final_mean_over_seeds") if isinstance(v, dict) and "runs" in v else v
                  for k, v in out.items()}, indent=2))  # fmt: skip
