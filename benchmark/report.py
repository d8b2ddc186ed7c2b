"""Every paper table and figure the runs cover, with the paper's number beside ours: `bash benchmark.sh report`.

Reads every summary.json (and eval_summary.json) under the given directories, and each run's per-episode file
(episodes.csv of dqn/rainbow, eval_curve.csv of cql), and writes one markdown table per paper table or figure:

* Elfwing et al. 2018: Table 1 (SZ-Tetris, final mean ± sd of the final-window episode scores, best run), Table 2
  (Sarsa(lambda) final and best means, DQN-normalised, mean and median over games), Table 3 (softmax vs epsilon-greedy).
* Obando-Ceron et al. 2024: per figure (suite) and variant, the IQM of human-normalised scores over games x seeds with
  95% stratified bootstrap CIs, computed by rliable (Agarwal et al. 2021); performance profiles; per-game scores
  beside the published DrQ(eps) means for Atari 100k.

Each table names the budget that was run against the paper's and the number of seeds. The paper numbers live in
paper_numbers.json with their sources. PNGs (learning curves per game with seeds shaded, IQM bars with CIs, the
expert-count scaling of Fig. 1, performance profiles) go beside the markdown in --out.

    python benchmark/report.py                      # runs/ and results/
    python benchmark/report.py moe-fig1             # one suite's runs, and which of its tasks failed or are missing
    python benchmark/report.py results/sarsa_atari_reduced --out /tmp/report
"""

import argparse
import csv
import glob
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)  # the repository: runs/ and results/ live there
sys.path.insert(0, HERE)
import suites  # noqa: E402  (the task lists of benchmark.sh's MoE suites, beside this file)

PAPER = json.load(open(os.path.join(HERE, "paper_numbers.json")))


# ---------------------------------------------------------------------------------------------------------------------
# Reading runs
def find_summaries(dirs):
    """Every summary.json / eval_summary.json under dirs, each loaded with '_path' set; unreadable files are skipped."""
    out, seen = [], set()
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "**", "*summary.json"), recursive=True)):
            real = os.path.realpath(path)
            if real in seen or os.path.basename(path) not in ("summary.json", "eval_summary.json"):
                continue
            seen.add(real)
            try:
                with open(path) as f:
                    s = json.load(f)
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(s, dict) and isinstance(s.get("args"), dict):
                s["_path"] = path
                out.append(s)
    return out


def kind(s) -> str:
    """Which script wrote this summary."""
    a = s["args"]
    if "network" in a and "holes_scale" in a:
        return "tetris-eval" if "eval" in s else "tetris"
    if "tau_k" in a and "activations" in a or "final_mean_score" in s:
        return "sarsa-eval" if "eval" in s else "sarsa"
    if "dataset_dir" in a:
        return "cql"
    if "preset" in a:
        return "rainbow"
    if "replay_ratio" in a:
        return "dqn"
    return "unknown"


def game_of(s) -> str:
    if s.get("game"):
        return s["game"]
    env = s["args"].get("env_id", "")
    return env.split("/")[-1].split("-v")[0]


def fmt(x, nd=1):
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "–"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{nd}f}"


def table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# Elfwing et al. 2018
def tetris_rows(s):
    """(network, activation, summary-with-final-scores) of a td_lambda_tetris summary; a combined multi-activation
    summary has its rows in per-activation sub-folders and gives none itself."""
    a = s["args"]
    act = s.get("activation", a.get("activation"))
    if isinstance(act, list):
        act = act[0] if len(act) == 1 else None
    if act is None or "final_score_per_run" not in s or "SZTetris" not in a.get("env_id", ""):
        return []
    return [(a["exp_name"], a["network"], act, s)]


def elfwing_table1(runs) -> str:
    paper = PAPER["elfwing_table1"]
    groups = {}
    for s in runs:
        if kind(s) == "tetris":
            for exp, net, act, r in tetris_rows(s):
                groups.setdefault((net, act), {}).setdefault(exp, []).append(r)
    if not groups:
        return ""
    rows = []
    for p in paper["rows"]:
        for exp, rs in sorted(groups.get((p["network"], p["activation"]), {}).items()):
            finals = np.concatenate([r["final_score_per_run"] for r in rs])
            sds = [r.get("final_score_sd_episodes") for r in rs]
            sd = sds[0] if len(rs) == 1 else None  # sd of the pooled final-window episodes: one command's own number
            best = max(rs, key=lambda r: r.get("final_score_best_run", -np.inf))
            episodes = np.concatenate([r.get("episodes_per_run", [0]) for r in rs])
            ours = (
                f"{fmt(float(finals.mean()))} ± {fmt(sd)}"
                if sd is not None
                else f"{fmt(float(finals.mean()))} (sd n/a)"
            )
            best_sd = best.get("final_score_best_run_sd_episodes")
            rows.append([
                f"{p['network']} {p['activation']}", exp, ours, f"{p['final_mean']} ± {p['final_sd']}",
                f"{fmt(best.get('final_score_best_run'))} ± {fmt(best_sd)}", f"{p['best_mean']} ± {p['best_sd']}",
                f"{fmt(float(episodes.mean()), 0)} / {paper['budget_episodes']:,}",
                f"{len(finals)} / {paper['runs'][p['network']]}",
                "yes" if all(r.get("complete") for r in rs) else "no",
            ])  # fmt: skip
    return (
        f"### Elfwing et al. Table 1: stochastic SZ-Tetris\n\nSource: {paper['source']}. Ours: mean over runs of the "
        "final-window (1,000 episodes) score; ± is the sd of the final-window episode scores of all runs, as the paper "
        "defines it.\n\n"
        + table(
            [
                "network",
                "run",
                "final mean (ours)",
                "paper",
                "best run (ours)",
                "paper",
                "episodes/run (ours / paper)",
                "runs (ours / paper)",
                "complete",
            ],
            rows,
        )  # fmt: skip
    )


def dqn_normalized(score, s):
    r, d = s.get("random_score"), s.get("dqn_score")
    return None if score is None or r is None or d is None or d == r else (score - r) / (d - r)


def elfwing_table2(runs) -> str:
    paper = PAPER["elfwing_table2"]
    groups = {}
    for s in runs:
        if kind(s) == "sarsa" and s.get("final_mean_score") is not None:
            groups.setdefault((s["args"]["exp_name"], game_of(s)), []).append(s)
    if not groups:
        return ""
    rows, per_config = [], {}
    for (exp, game), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        final = float(np.mean([r["final_mean_score"] for r in rs]))
        best = float(np.mean([r["best_mean_score"] for r in rs]))
        p = paper["games"].get(game, {})
        nf, nb = dqn_normalized(final, rs[0]), dqn_normalized(best, rs[0])
        per_config.setdefault(exp, []).append((nf, nb))
        episodes = np.mean([r.get("episodes", 0) for r in rs])
        rows.append([game, exp, fmt(final), p.get("final", "–"), fmt(best), p.get("best", "–"),
                     fmt(None if nf is None else 100 * nf, 0) + "%", fmt(None if nb is None else 100 * nb, 0) + "%",
                     f"{episodes:,.0f} / {paper['budget_episodes']:,}", f"{len(rs)} / {paper['runs']}"])  # fmt: skip
    summary = []
    for exp, vals in per_config.items():
        nf = [v[0] for v in vals if v[0] is not None]
        nb = [v[1] for v in vals if v[1] is not None]
        if nf:
            summary.append([exp, len(nf), f"{100 * np.mean(nf):.0f}% / {100 * np.median(nf):.0f}%",
                            f"{100 * np.mean(nb):.0f}% / {100 * np.median(nb):.0f}%"])  # fmt: skip
    m, md = paper["mean_dqn_normalized_percent"], paper["median_dqn_normalized_percent"]
    summary.append(["paper (12 games)", 12, f"{m['final']}% / {md['final']}%", f"{m['best']}% / {md['best']}%"])
    return (
        f"### Elfwing et al. Table 2: Sarsa(λ) SiLU-dSiLU on Atari\n\nSource: {paper['source']}.\n\n"
        + table(
            [
                "game",
                "run",
                "final (ours)",
                "paper",
                "best (ours)",
                "paper",
                "final DQN-norm.",
                "best DQN-norm.",
                "episodes (ours / paper)",
                "runs (ours / paper)",
            ],
            rows,
        )  # fmt: skip
        + "\n\nMean / median DQN-normalised over the games each configuration covers:\n\n"
        + table(["configuration", "games", "final (mean / median)", "best (mean / median)"], summary)
    )


def elfwing_table3(runs) -> str:
    paper = PAPER["elfwing_table3"]
    rows = []
    for s in runs:
        k = kind(s)
        if k not in ("tetris-eval", "sarsa-eval"):
            continue
        game = "SZ-Tetris" if k == "tetris-eval" else game_of(s)
        if k == "tetris-eval" and "SZTetris" not in s["args"].get("env_id", ""):
            continue
        ref = {r["selection"]: r for r in paper["games"].get(game, [])}
        for key, e in s["eval"].items():
            sel = key.split(":")[0] if key.startswith("softmax") else key
            p = ref.get(sel, {})
            rows.append([game, key, e.get("episodes", "–"), fmt(e.get("mean_score")), fmt(p.get("mean_score")),
                         fmt(e.get("exploratory_actions_per_episode"), 2), fmt(p.get("exploratory_actions"), 2),
                         os.path.relpath(os.path.dirname(s["_path"]), ROOT)])  # fmt: skip
    if not rows:
        return ""
    return f"### Elfwing et al. Table 3: softmax against ε-greedy selection\n\nSource: {paper['source']}.\n\n" + table(
        ["game", "selection", "episodes", "mean score (ours)", "paper", "exploratory actions (ours)", "paper", "run"],
        rows,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Obando-Ceron et al. 2024 (rliable)
def run_score(s):
    """The run's human-normalised score: the last evaluation's when the run has one (Atari 100k, CQL), else the mean
    of its last 100 training episodes (Dopamine's continuous_train reporting)."""
    if kind(s) == "cql":
        return s.get("eval_human_normalized_score")
    ev = s.get("evaluations") or []
    if ev and ev[-1].get("human_normalized_score") is not None:
        return ev[-1]["human_normalized_score"]
    return s.get("human_normalized_score")


def variant_of(s):
    """(figure, variant) of an online/offline MoE run: from the suite's exp_name when benchmark.sh launched it."""
    a = s["args"]
    exp = a.get("exp_name", "")
    head, _, tail = exp.partition(".")
    if head in suites.SUITES and tail:
        return head, tail
    algo = {"dqn": "dqn", "cql": a.get("agent", "cql"), "rainbow": a.get("preset", "rainbow")}[kind(s)]
    moe = a.get("moe", "none")
    v = f"{algo}-{moe}-{a.get('encoder', '')}"
    if moe != "none":
        v += f"-e{s.get('num_experts') or a.get('num_experts') or 8}"
    elif a.get("width_multiplier", 1) != 1:
        v += f"-x{a['width_multiplier']}"
    return "other", v


def budget_of(s) -> str:
    a = s["args"]
    if kind(s) == "cql":
        return f"{s.get('updates', 0):,} / {a.get('num_iterations', 0) * a.get('steps_per_iteration', 0):,} grad steps"
    return f"{s.get('global_step', 0):,} / {a.get('total_timesteps', 0):,} steps"


def score_matrix(entries):
    """entries: [(game, seed, score)] -> (runs x games) array with the same number of runs per game (the smallest),
    the games, and how many runs were left out to make it rectangular."""
    by_game = {}
    for game, _seed, score in sorted(entries):
        by_game.setdefault(game, []).append(score)
    games = sorted(by_game)
    n = min(len(v) for v in by_game.values())
    dropped = sum(len(v) - n for v in by_game.values())
    return np.array([by_game[g][:n] for g in games]).T, games, dropped


def iqm_with_ci(matrices: dict, reps: int, seed: int = 0):
    """rliable: IQM point estimate and 95% stratified bootstrap CI per key."""
    from rliable import library as rly
    from rliable import metrics

    np.random.seed(seed)
    point, ci = rly.get_interval_estimates(matrices, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=reps)
    return {k: (float(point[k][0]), float(ci[k][0][0]), float(ci[k][1][0])) for k in matrices}


def moe_tables(runs, out_dir, reps, plots) -> list[str]:
    groups = {}  # figure -> variant -> [summary]
    for s in runs:
        if kind(s) in ("dqn", "rainbow", "cql"):
            fig, var = variant_of(s)
            groups.setdefault(fig, {}).setdefault(var, []).append(s)
    for variants in groups.values():  # a resumed run leaves one directory per segment: keep the furthest
        for var, rs in variants.items():
            last = {}
            for r in rs:
                key = (r["args"].get("exp_name"), game_of(r), r["args"].get("seed"))
                if key not in last or r.get("global_step", r.get("updates", 0)) > last[key].get(
                    "global_step", last[key].get("updates", 0)
                ):
                    last[key] = r
            variants[var] = list(last.values())
    sections = []
    for fig in sorted(groups, key=lambda f: (f == "other", f)):
        variants = groups[fig]
        matrices, info, unscored = {}, {}, []
        for var, rs in sorted(variants.items()):
            entries = [(game_of(r), r["args"]["seed"], run_score(r)) for r in rs]
            scored = [e for e in entries if e[2] is not None]
            unscored += [f"{var} {g} seed {sd}" for g, sd, sc in entries if sc is None]
            if not scored:
                continue
            m, games, dropped = score_matrix(scored)
            if m.size == 0:
                continue
            matrices[var] = m
            info[var] = (games, m.shape[0], dropped, rs)
        title = f"Soft MoE paper, {fig}" if fig != "other" else "MoE-paper agents outside the named suites"
        ref = PAPER["moe_figures"].get(fig, {})
        text = [f"### {title}"]
        if ref:
            if "budget_steps" in ref:
                budget = f"{ref['budget_steps']:,} environment steps (frames; {ref['budget_steps'] // 4:,} agent steps)"
            elif "budget_agent_steps" in ref:
                budget = f"{ref['budget_agent_steps']:,} agent steps"
            else:
                budget = f"{ref['budget_gradient_steps']:,} gradient steps"
            text.append(f"Paper: {ref['paper']}. Source: {ref['source']}. Paper protocol: {ref['games']} games x "
                        f"{ref['seeds']} seeds, {budget} per run.")  # fmt: skip
        if not matrices:
            text.append("No run has a score yet.")
            sections.append("\n\n".join(text))
            continue
        est = iqm_with_ci(matrices, reps)
        rows = []
        for var in matrices:
            games, n, dropped, rs = info[var]
            iqm, lo, hi = est[var]
            budgets = sorted({budget_of(r) for r in rs})
            rows.append([var, f"{iqm:.3f}", f"[{lo:.3f}, {hi:.3f}]", len(games), n,
                         budgets[0] + (f" (+{len(budgets) - 1} other)" if len(budgets) > 1 else ""),
                         sum(bool(r.get("complete")) for r in rs), dropped])  # fmt: skip
        text.append(
            f"IQM of human-normalised scores over games x seeds, 95% stratified bootstrap CI (rliable, {reps} reps)."
            "\n\n"
            + table(
                [
                    "variant",
                    "IQM",
                    "95% CI",
                    "games",
                    "seeds per game",
                    "budget (ours / asked)",
                    "complete runs",
                    "runs left out (uneven seeds)",
                ],
                rows,
            )  # fmt: skip
        )
        if fig in ("atari100k", "other"):
            per_game = atari100k_per_game(variants)
            if per_game:
                text.append(per_game)
        if unscored:
            text.append("No score yet (no finished episode or evaluation): " + ", ".join(unscored[:20])
                        + (f" and {len(unscored) - 20} more" if len(unscored) > 20 else ""))  # fmt: skip
        if plots:
            text += make_plots(fig, matrices, est, variants, out_dir)
        sections.append("\n\n".join(text))
    return sections


def atari100k_per_game(variants) -> str:
    """Per-game raw scores of the Atari-100k runs (DrQ(eps) and DER presets) beside the published per-game means."""
    sections = []
    for preset, key in (("drq-eps", "drq_eps_atari100k"), ("der", "der_atari100k")):
        ref, rows = PAPER[key], []
        for var, rs in sorted(variants.items()):
            by_game = {}
            for r in rs:
                if r["args"].get("preset") != preset:
                    continue
                ev = r.get("evaluations") or []
                score = ev[-1]["mean_return"] if ev else r.get("mean_return_last_100")
                if score is not None:
                    by_game.setdefault(game_of(r), []).append(score)
            for game, scores in sorted(by_game.items()):
                rows.append([var, game, fmt(float(np.mean(scores))), len(scores), fmt(ref["games"].get(game))])
        if rows:
            name = "DrQ(ε)" if preset == "drq-eps" else "DER"
            sections.append(
                f"Per-game raw scores of the {name} runs beside the published {name} means ({ref['source']}):\n\n"
                + table(["variant", "game", "mean score (ours)", "seeds", f"{name} published"], rows)
            )
    return "\n\n".join(sections)


# ---------------------------------------------------------------------------------------------------------------------
# Plots
def make_plots(fig, matrices, est, variants, out_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    links = []
    names = list(matrices)
    # IQM bars with their CIs
    f, ax = plt.subplots(figsize=(6, 0.4 * len(names) + 1.2))
    iqm = [est[n][0] for n in names]
    err = np.array([[est[n][0] - est[n][1] for n in names], [est[n][2] - est[n][0] for n in names]])
    ax.barh(range(len(names)), iqm, xerr=err, color="tab:blue", alpha=0.7, capsize=3)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("IQM human-normalised score (95% CI)")
    ax.set_title(fig)
    f.tight_layout()
    path = os.path.join(out_dir, f"{fig}_iqm.png")
    f.savefig(path, dpi=100)
    plt.close(f)
    links.append(f"![IQM {fig}]({os.path.basename(path)})")
    # the expert-count scaling of Fig. 1
    if fig == "moe-fig1":
        f, ax = plt.subplots(figsize=(6, 4))
        for algo in ("dqn", "rainbow"):
            for tag, label in (("softmoe-e", "Soft MoE, experts"), ("none-x", "baseline, width x")):
                ks = [k for k in (1, 2, 4, 8) if f"{algo}-{tag}{k}" in est]
                if ks:
                    e = [est[f"{algo}-{tag}{k}"] for k in ks]
                    y = np.array([v[0] for v in e])
                    yerr = np.array([[v[0] - v[1] for v in e], [v[2] - v[0] for v in e]])
                    ax.errorbar(ks, y, yerr=yerr, marker="o", capsize=3, label=f"{algo}: {label}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("experts / width multiplier")
        ax.set_ylabel("IQM human-normalised score")
        ax.legend(fontsize=8)
        f.tight_layout()
        path = os.path.join(out_dir, "moe-fig1_scaling.png")
        f.savefig(path, dpi=100)
        plt.close(f)
        links.append(f"![expert scaling]({os.path.basename(path)})")
    # performance profiles (rliable)
    try:
        from rliable import library as rly
        from rliable import plot_utils

        taus = np.linspace(-0.5, 2.0, 51)
        profiles, cis = rly.create_performance_profile(matrices, taus, reps=200)
        f, ax = plt.subplots(figsize=(6, 4))
        plot_utils.plot_performance_profiles(profiles, taus, performance_profile_cis=cis, ax=ax,
                                             xlabel=r"human-normalised score $(\tau)$")  # fmt: skip
        ax.legend(list(profiles), fontsize=7)
        f.tight_layout()
        path = os.path.join(out_dir, f"{fig}_profiles.png")
        f.savefig(path, dpi=100)
        plt.close(f)
        links.append(f"![performance profiles {fig}]({os.path.basename(path)})")
    except Exception as e:  # a profile needs scores that vary; say why instead of stopping the report
        links.append(f"(performance profile not drawn: {type(e).__name__}: {e})")
    # learning curves per game, seeds shaded (min to max over seeds)
    games = sorted({game_of(r) for rs in variants.values() for r in rs})
    f, axes = plt.subplots(1, len(games), figsize=(4.5 * len(games), 3.5), squeeze=False)
    for ax, game in zip(axes[0], games, strict=True):
        for var, rs in sorted(variants.items()):
            curves = [c for c in (episode_curve(r) for r in rs if game_of(r) == game) if c is not None]
            if not curves:
                continue
            end = max(c[0][-1] for c in curves)
            grid = np.linspace(0, end, 50)
            ys = np.array([np.interp(grid, x, y) for x, y in curves])
            (line,) = ax.plot(grid, ys.mean(0), label=f"{var} ({len(curves)})")
            ax.fill_between(grid, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.2)
        ax.set_title(game)
        ax.set_xlabel("agent steps (cql: gradient steps)")
    axes[0][0].set_ylabel("return")
    axes[0][-1].legend(fontsize=6)
    f.tight_layout()
    path = os.path.join(out_dir, f"{fig}_curves.png")
    f.savefig(path, dpi=80)
    plt.close(f)
    links.append(f"![learning curves {fig}]({os.path.basename(path)})")
    return links


def episode_curve(s):
    """(x, smoothed return) from the run's per-episode file: episodes.csv (dqn, rainbow) or eval_curve.csv (cql)."""
    d = os.path.dirname(s["_path"])
    try:
        if kind(s) == "cql":
            with open(os.path.join(d, "eval_curve.csv")) as f:
                rows = [(float(r["gradient_steps"]), float(r["mean_return"])) for r in csv.DictReader(f)]
        else:
            with open(os.path.join(d, "episodes.csv")) as f:
                rows = [(float(r["global_step"]), float(r["return"])) for r in csv.DictReader(f)]
    except (OSError, KeyError, ValueError):
        return None
    if len(rows) < 2:
        return None
    x, y = np.array(rows).T
    k = max(1, min(100, len(y) // 10))
    y = np.convolve(y, np.ones(k) / k, mode="valid")
    return x[k - 1 :], y


# ---------------------------------------------------------------------------------------------------------------------
# Suites: which tasks finished, failed or are missing
def task_status(suite: str, runs) -> str:
    path = os.path.join(ROOT, "runs", "suites", f"{suite}.json")
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        manifest = json.load(f)
    found = {}
    for s in runs:
        a = s["args"]
        key = (a.get("exp_name"), game_of(s), a.get("seed"))
        if key not in found or os.path.getmtime(s["_path"]) > os.path.getmtime(found[key]["_path"]):
            found[key] = s
    rows, counts = [], {}
    for t in manifest["tasks"]:
        s = found.get((t["exp_name"], t["game"], t["seed"]))
        log = os.path.join(ROOT, t["log"])
        if s is not None:
            state = "complete" if s.get("complete") else "incomplete"
            where = os.path.relpath(os.path.dirname(s["_path"]), ROOT)
        elif os.path.exists(log):
            with open(log, errors="replace") as f:
                tail = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
            state, where = "failed", (tail[-1][:100] if tail else "empty log")
        else:
            state, where = "missing", "no log, no run directory"
        counts[state] = counts.get(state, 0) + 1
        rows.append([t["game"], t["variant"], t["seed"], state, where])
    head = (f"### Tasks of {suite} ({manifest['budget']} budget, {manifest['how']}"
            + (f", job {manifest['job_id']}" if manifest.get("job_id") else "") + ")\n\n"
            + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + "\n\n")  # fmt: skip
    return head + table(["game", "variant", "seed", "state", "run directory / last log line"], rows)


# ---------------------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmark.sh report", description=__doc__.splitlines()[0])
    p.add_argument("targets", nargs="*", help="suite names and/or directories (default: runs results)")
    p.add_argument("--out", default="runs/report", help="folder for report.md and the PNGs")
    p.add_argument("--reps", type=int, default=2000, help="bootstrap resamples (rliable's default is 50,000)")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    os.chdir(ROOT)
    dirs, wanted = [], []
    for t in args.targets or ["runs", "results"]:
        if t in suites.SUITES:
            wanted.append(t)
        elif os.path.isdir(t):
            dirs.append(t)
        elif args.targets:
            raise SystemExit(f"error: '{t}' is neither a suite ({', '.join(suites.SUITES)}) nor a directory")
    if wanted and not dirs:
        dirs = ["runs"]
    runs = find_summaries(dirs)
    if wanted:
        runs = [s for s in runs if s["args"].get("exp_name", "").partition(".")[0] in wanted]
    status = [x for x in (task_status(s, runs) for s in wanted) if x]
    if not runs and not status:
        where = ", ".join(dirs) if dirs else "runs"
        raise SystemExit(
            f"error: nothing to report: no summary.json in {where}" + (f" for {', '.join(wanted)}" if wanted else "")
        )
    sections = [x for x in (elfwing_table1(runs), elfwing_table2(runs), elfwing_table3(runs)) if x]
    sections += moe_tables(runs, args.out, args.reps, not args.no_plots)
    sections += status
    text = f"# Report: {len(runs)} runs from {', '.join(dirs)}\n\n" + "\n\n".join(sections) + "\n"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(text)
    print(text)
    print(f"(written to {os.path.join(args.out, 'report.md')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
