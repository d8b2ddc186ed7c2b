"""Every paper table and figure the runs cover, with the paper's number beside ours: `bash benchmark.sh report`.

Reads every summary.json (and eval_summary.json) under the given directories, each run's per-episode file
(episodes.csv of dqn/rainbow, eval_curve.csv of cql), and every table1.json that results/tetris_table1_paper/settle.py
wrote, and writes one markdown table per paper table or figure:

* Elfwing et al. 2018: Table 1 (SZ-Tetris; where a table1.json exists, its full-budget result leads: per activation
  the runs, mean with its bootstrap CI over runs, median, sd, best run, and the five tests with their verdicts; runs
  in its own folder are counted under it, not tabled again), Table 2
  (Sarsa(lambda) final and best means, DQN-normalised, mean and median over games), Table 3 (softmax vs epsilon-greedy).
* Obando-Ceron et al. 2024: per comparison, the IQM of human-normalised scores over games x seeds with 95% stratified
  bootstrap CIs, computed by rliable (Agarwal et al. 2021); per-game scores beside the published DrQ(eps) and DER means
  for Atari 100k. Runs share a comparison only when they share the suite or results folder, agent, protocol, budget,
  encoder and games (the rules are printed with the tables).

A results folder whose README.md says "Superseded by ..." is left out (named at the end of the report;
--include-superseded keeps it). Each table names the budget that was run against the paper's and the number of runs.
The paper numbers live in paper_numbers.json with their sources. PNGs (IQM bars, one panel per comparison; learning
curves; performance profiles; the expert-count scaling of Fig. 1) go beside the markdown in --out.

    python benchmark/report.py                      # runs/ and results/
    python benchmark/report.py moe-fig1             # one suite's runs, and which of its tasks failed or are missing
    python benchmark/report.py results/sarsa_atari_reduced --out /tmp/report
"""

import argparse
import collections
import csv
import json
import os
import re
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)  # the repository: runs/ and results/ live there
sys.path.insert(0, HERE)
import suites  # noqa: E402  (the task lists of benchmark.sh's MoE suites, beside this file)

PAPER = json.load(open(os.path.join(HERE, "paper_numbers.json")))
MIN_RUNS_FOR_CI = 5  # games x seeds: below this a variant's IQM is printed without an interval
MIN_SEEDS_FOR_CI = 2  # per game: with one seed a stratified bootstrap has nothing to resample within a game
ONE_TRAJECTORY = 0.75  # an evaluation whose most common return covers this share of its episodes is ~one game


# ---------------------------------------------------------------------------------------------------------------------
# Reading runs
def tetris_eval_args(s, path) -> dict:
    """benchmark/tetris_eval.py's summary.json has no 'args': the evaluated run's experiment and environment from its
    checkpoint's run folder (td_lambda_tetris.py names it {env}__{exp_name}__{network}__{seed}__{time})."""
    parts = os.path.basename(os.path.dirname(str(s.get("checkpoint", "")))).split("__")
    if len(parts) == 5:
        return {"exp_name": parts[1], "env_id": f"envs/{parts[0]}"}
    # settle.py's folder (a table1.json beside or above) is SZ-Tetris Table 1's
    d = os.path.dirname(path)
    sz = any(os.path.exists(os.path.join(x, "table1.json")) for x in (d, os.path.dirname(d)))
    return {"exp_name": "", "env_id": "envs/SZTetris-v0" if sz else ""}


def files_under(d: str, names: tuple) -> list:
    """Every file named one of `names` under folder d (or d itself if it is such a file), sorted, leaving out any
    folder below d that is a checkout of its own (holds a .git: the git worktrees a results queue runs its code from
    hold a copy of every results folder)."""
    if os.path.isfile(d):
        return [d] if os.path.basename(d) in names else []
    found, visited = [], set()
    for here, folders, files in os.walk(d, followlinks=True):  # as glob's "**": hidden folders skipped, links followed
        visited.add(os.path.realpath(here))
        folders[:] = sorted(
            f
            for f in folders
            if not f.startswith(".")
            and not os.path.exists(os.path.join(here, f, ".git"))
            and os.path.realpath(os.path.join(here, f)) not in visited
        )
        found += [os.path.join(here, f) for f in files if f in names]
    return sorted(found)


def find_summaries(dirs, unreadable=None):
    """Every summary.json / eval_summary.json under dirs, each loaded with '_path' (and '_root', the folder it was
    found under) set; an unreadable file is skipped, and its path and why appended to `unreadable` where given."""
    out, seen = [], set()
    for d in dirs:
        for path in files_under(d, ("summary.json", "eval_summary.json")):
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            try:
                with open(path) as f:
                    s = json.load(f)
            except (OSError, json.JSONDecodeError) as err:
                skipped(unreadable, path, err)
                continue
            if not isinstance(s, dict):
                skipped(unreadable, path, "not a JSON object")
                continue
            if "args" not in s and isinstance(s.get("eval"), dict) and "eval_runs" in s:
                s["args"] = tetris_eval_args(s, path)
            if isinstance(s.get("args"), dict):
                s["_path"], s["_root"] = path, d
                out.append(s)
    return out


def find_table1(dirs, unreadable=None):
    """Every table1.json (results/tetris_table1_paper/settle.py's output) under dirs, with '_path' set; an unreadable
    one (or one not in settle.py's schema) is appended to `unreadable` where given."""
    out, seen = [], set()
    for d in dirs:
        for path in files_under(d, ("table1.json",)):
            if os.path.realpath(path) in seen:
                continue
            seen.add(os.path.realpath(path))
            try:
                with open(path) as f:
                    t = json.load(f)
            except (OSError, json.JSONDecodeError) as err:
                skipped(unreadable, path, err)
                continue
            if isinstance(t, dict) and isinstance(t.get("activations"), dict) and isinstance(t.get("tests"), list):
                t["_path"] = path
                out.append(t)
            else:
                skipped(unreadable, path, "not settle.py's schema")
    return out


def skipped(unreadable, path, why):
    if unreadable is not None:
        unreadable.append(f"skipped (unreadable): {rel(path)} ({why})")


def rel(path) -> str:
    """A path as the report prints it: relative to the repository where it lies inside it."""
    r = os.path.relpath(os.path.realpath(path), os.path.realpath(ROOT))
    return path if r.startswith("..") else r


def experiment_dir(s) -> str:
    """The experiment a run belongs to: the nearest folder, from the run's own up to the folder the report was
    pointed at, that holds a README.md (as results/<experiment>/ does); else the folder the report was pointed at."""
    root = os.path.realpath(s.get("_root") or os.path.dirname(s["_path"]))
    cur = os.path.dirname(os.path.realpath(s["_path"]))
    while cur == root or cur.startswith(root + os.sep):
        if os.path.exists(os.path.join(cur, "README.md")) or cur == root:
            return cur
        cur = os.path.dirname(cur)
    return root


_SUPERSEDED = {}


def unlink(line: str) -> str:
    """A README line without its markdown links' targets (relative to that README, not to the report)."""
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line)


def superseded(s):
    """The "Superseded by ..." line of the run's experiment README.md, or None."""
    d = experiment_dir(s)
    if d not in _SUPERSEDED:
        _SUPERSEDED[d] = None
        try:
            with open(os.path.join(d, "README.md")) as f:
                for line in f.read().splitlines()[:20]:
                    if line.startswith("Superseded by"):
                        _SUPERSEDED[d] = line.strip()
                        break
        except OSError:
            pass
    return _SUPERSEDED[d]


def kind(s) -> str:
    """Which script wrote this summary."""
    a = s["args"]
    if "eval_runs" in s or "network" in a and "holes_scale" in a:
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


TRAINING = ("tetris", "sarsa", "dqn", "rainbow", "cql")  # the kinds a --resume goes on from (evaluations do not)


def tail(path) -> tuple:
    """A checkpoint's run folder and file name: how a path names it wherever the run folder was moved or copied."""
    return tuple(os.path.normpath(str(path)).split(os.sep)[-2:])


def checkpoint_names(s) -> set:
    """The names a --resume may give the run's checkpoint: the path it recorded, and the file beside this summary.json
    (or beside the run's, for the per-activation summary.json of a batched Tetris run)."""
    if kind(s) not in TRAINING or not s.get("checkpoint"):
        return set()
    here, file = os.path.dirname(s["_path"]), os.path.basename(s["checkpoint"])
    names = {tail(s["checkpoint"]), tail(os.path.join(here, file))}
    if os.path.basename(here) == s.get("activation"):
        names.add(tail(os.path.join(os.path.dirname(here), file)))
    return {(kind(s), game_of(s), n) for n in names}


def last_segments(runs) -> list:
    """The runs less every resumed segment: each resume writes a new run folder, so a summary whose checkpoint another
    training summary's --resume (--load-model) names is superseded by it. Each kept summary gets '_first_exp', the
    experiment name of the chain's first segment."""
    named = {}
    for s in runs:
        for n in checkpoint_names(s):
            named.setdefault(n, []).append(s)
    earlier, superseded = {}, set()
    for s in runs:
        resume = s["args"].get("resume") or s["args"].get("load_model")
        if kind(s) in TRAINING and resume:
            for e in named.get((kind(s), game_of(s), tail(resume)), []):
                if e is not s:  # a run folder copied over its first segment's names its own checkpoint
                    earlier[id(s)] = e
                    superseded.add(id(e))
    out = []
    for s in runs:
        if id(s) not in superseded:
            first, seen = s, {id(s)}
            while id(first) in earlier and id(earlier[id(first)]) not in seen:
                first = earlier[id(first)]
                seen.add(id(first))
            s["_first_exp"] = first["args"].get("exp_name", "")
            out.append(s)
    return out


def counted(rs) -> tuple[list, str]:
    """The summaries a row counts and its 'complete' cell. As in the Soft MoE tables: where some summaries of a row are
    complete, its incomplete ones (in progress or stopped) are left out and the cell says how many; where none is,
    all count and the cell says no."""
    done = [r for r in rs if r.get("complete")]
    if not done:
        return rs, "no"
    return done, "yes" if len(done) == len(rs) else f"yes ({len(rs) - len(done)} incomplete summary.json left out)"


ROW_RULE = (
    "A row is one experiment at one budget (episodes asked). Of a resumed run only its last segment counts (named "
    "beside the first where the resume ran under another name). Where some of a row's summary.json are complete, its "
    "incomplete ones are left out; a row of incomplete runs only says no under complete."
)


def run_label(exp, rs) -> str:
    """The row's experiment, and the name of its last segment where a resume ran under another name."""
    later = sorted({r["args"].get("exp_name", "") for r in rs} - {exp})
    return exp + (f" (resumed as {', '.join(later)})" if later else "")


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


def runs_per_activation(rows: dict) -> str:
    """'30 runs per activation', or each activation's count where they differ."""
    counts = {act: r["runs"] for act, r in rows.items()}
    if len(set(counts.values())) == 1:
        return f"{next(iter(counts.values()))} runs per activation"
    return "runs per activation: " + ", ".join(f"{act} {n}" for act, n in counts.items())


def settled_table1(t) -> str:
    """Table 1's shallow rows from a table1.json of settle.py: per activation, then the five tests."""
    paper = PAPER["elfwing_table1"]
    at, rows = t["at_episode"], t["activations"]
    rows_md = []
    for act, r in rows.items():
        rows_md.append([f"shallow {act}", r["runs"], f"**{r['mean']:.1f}** ({r['ci95'][0]:.1f}–{r['ci95'][1]:.1f})",
                        f"{r['median']:.1f}", f"{r['sd_over_runs']:.1f}", f"{r['sd_episodes']:.1f}",
                        f"{r['best_run']:.1f}", f"{r['paper_mean']} ± {r['paper_sd']}", r["paper_best"]])  # fmt: skip
    tests = []
    for c in t["tests"]:
        tests.append([f"{c['a']} – {c['b']}", f"{c['difference']:+.1f}", f"{c['welch_z']:.2f}",
                      f"{c['permutation_p']:.2g}", f"{c['holm_p']:.2g}", c["verdict"]])  # fmt: skip
    n_settled = sum(c["verdict"].startswith("settled") for c in t["tests"])
    budget = "the paper's budget" if at == paper["budget_episodes"] else f"the paper's: {paper['budget_episodes']:,}"
    return (
        f"### Elfwing et al. Table 1: stochastic SZ-Tetris, shallow networks, {runs_per_activation(rows)} at "
        f"{at:,} episodes\n\nSource: {paper['source']}; the paper ran {paper['runs']['shallow']} runs per shallow "
        f"row at {paper['budget_episodes']:,} episodes.\n\nOurs: `{rel(t['_path'])}`, written by settle.py beside "
        f"it (inputs: {'; '.join(t.get('sources', [])) or 'not recorded'}): {runs_per_activation(rows)} at {at:,} "
        f"episodes ({budget}). A run's score is its mean over episodes {at - 1000:,}–{at - 1:,}, and the run scores "
        "are the samples: mean, median and sd over runs, a 95% percentile bootstrap CI of the mean "
        f"({t['resamples']:,} resamples of the runs), the sd of the final-window episode scores of all runs (the "
        "paper's ±), and the best run's score.\n\n"
        + table(
            [
                "network",
                "runs",
                "mean (95% CI over runs)",
                "median",
                "sd over runs",
                "sd of episodes",
                "best run",
                "paper: mean ± sd",
                "paper: best run",
            ],
            rows_md,
        )  # fmt: skip
        + f"\n\nThe tests ({n_settled} of {len(tests)} settled): Welch's z over the run scores, a two-sided "
        f"permutation test of the difference of means ({t['permutations']:,} relabellings of the runs), the "
        f"{len(tests)} p values Holm-adjusted; settled where the adjusted p < {t['alpha']}.\n\n"
        + table(
            ["comparison", "difference of means", "Welch's z", "permutation p", "Holm-adjusted p", "verdict"], tests
        )  # fmt: skip
    )


def elfwing_table1(runs, settled=()) -> str:
    """Table 1: the full-budget result of each table1.json first; the summary.json runs of Table 1's rows after it
    (or alone, as Table 1, where no table1.json was found)."""
    paper = PAPER["elfwing_table1"]
    groups = {}  # (network, activation) -> (experiment, episodes asked) -> summaries: a row per budget
    own = {os.path.realpath(os.path.dirname(t["_path"])): 0 for t in settled}  # a table1.json's folder: its runs
    for s in last_segments(runs):
        if kind(s) != "tetris":
            continue
        if (folder := experiment_dir(s)) in own:  # in the settled result already
            own[folder] += 1
            continue
        for _, net, act, r in tetris_rows(s):
            key = (r["_first_exp"], r["args"].get("total_episodes"))
            groups.setdefault((net, act), {}).setdefault(key, []).append(r)
    sections = [settled_table1(t) for t in settled]
    if counts := [f"{n} summary.json under {rel(d)}" for d, n in own.items() if n]:
        sections.append(f"({', '.join(counts)}: runs of the result above, not tabled again.)")
    if not groups:
        return "\n\n".join(sections)
    rows = []
    order = ["dsilu", "sigmoid", "silu", "relu", "silu-dsilu", "silu-silu", "relu-relu"]  # Table 1's order
    for p in sorted(paper["rows"], key=lambda p: order.index(p["activation"]) if p["activation"] in order else 9):
        row_groups = groups.get((p["network"], p["activation"]), {})
        for (exp, asked), all_rs in sorted(row_groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            rs, complete = counted(all_rs)
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
            folder = sorted({rel(experiment_dir(r)) for r in rs})
            rows.append([
                f"{p['network']} {p['activation']}", run_label(exp, rs), ", ".join(folder), ours,
                f"{p['final_mean']} ± {p['final_sd']}",
                f"{fmt(best.get('final_score_best_run'))} ± {fmt(best_sd)}", f"{p['best_mean']} ± {p['best_sd']}",
                f"{fmt(float(episodes.mean()), 0)} / {fmt(asked, 0)} / {paper['budget_episodes']:,}",
                f"{len(finals)} / {paper['runs'][p['network']]}", complete,
            ])  # fmt: skip
    head = (
        "### Other runs of Table 1's rows (not the result above: reduced budgets, checks, runs in progress)"
        if settled
        else f"### Elfwing et al. Table 1: stochastic SZ-Tetris\n\nSource: {paper['source']}."
    )
    sections.append(
        f"{head}\n\nOurs: mean over runs of the final-window (1,000 episodes) score; ± is the sd of the final-window "
        f"episode scores of all runs, as the paper defines it. {ROW_RULE}\n\n"
        + table(
            [
                "network",
                "run",
                "folder",
                "final mean (ours)",
                "paper",
                "best run (ours)",
                "paper",
                "episodes/run (ours / asked / paper)",
                "runs (ours / paper)",
                "complete",
            ],
            rows,
        )  # fmt: skip
    )
    return "\n\n".join(sections)


def dqn_normalized(score, s):
    r, d = s.get("random_score"), s.get("dqn_score")
    return None if score is None or r is None or d is None or d == r else (score - r) / (d - r)


def elfwing_table2(runs) -> str:
    paper = PAPER["elfwing_table2"]
    groups = {}  # (experiment, game, episodes asked) -> summaries: a row per budget
    for s in last_segments(runs):
        if kind(s) == "sarsa" and s.get("final_mean_score") is not None:
            groups.setdefault((s["_first_exp"], game_of(s), s["args"].get("total_episodes")), []).append(s)
    if not groups:
        return ""
    rows, per_config = [], {}
    for (exp, game, asked), all_rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2] or 0)):
        rs, complete = counted(all_rs)
        final = float(np.mean([r["final_mean_score"] for r in rs]))
        best = float(np.mean([r["best_mean_score"] for r in rs]))
        p = paper["games"].get(game, {})
        nf, nb = dqn_normalized(final, rs[0]), dqn_normalized(best, rs[0])
        per_config.setdefault((exp, asked), []).append((nf, nb, complete != "no"))
        episodes = np.mean([r.get("episodes", 0) for r in rs])
        rows.append([game, run_label(exp, rs), fmt(final), p.get("final", "–"), fmt(best), p.get("best", "–"),
                     fmt(None if nf is None else 100 * nf, 0) + "%", fmt(None if nb is None else 100 * nb, 0) + "%",
                     f"{episodes:,.0f} / {fmt(asked, 0)} / {paper['budget_episodes']:,}",
                     f"{len(rs)} / {paper['runs']}", complete])  # fmt: skip
    summary = []
    for (exp, asked), vals in per_config.items():
        nf = [v[0] for v in vals if v[0] is not None]
        nb = [v[1] for v in vals if v[1] is not None]
        incomplete = sum(not v[2] for v in vals if v[0] is not None)
        if nf:
            summary.append([f"{exp}, {fmt(asked, 0)} episodes asked", len(nf),
                            "yes" if not incomplete else f"no ({incomplete} of {len(nf)} games incomplete)",
                            f"{100 * np.mean(nf):.0f}% / {100 * np.median(nf):.0f}%",
                            f"{100 * np.mean(nb):.0f}% / {100 * np.median(nb):.0f}%"])  # fmt: skip
    m, md = paper["mean_dqn_normalized_percent"], paper["median_dqn_normalized_percent"]
    summary.append([f"paper, {paper['budget_episodes']:,} episodes", 12, "yes", f"{m['final']}% / {md['final']}%",
                    f"{m['best']}% / {md['best']}%"])  # fmt: skip
    return (
        f"### Elfwing et al. Table 2: Sarsa(λ) SiLU-dSiLU on Atari\n\nSource: {paper['source']}.\n\n{ROW_RULE}\n\n"
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
                "episodes (ours / asked / paper)",
                "runs (ours / paper)",
                "complete",
            ],
            rows,
        )  # fmt: skip
        + "\n\nMean / median DQN-normalised over the games each configuration (an experiment at one budget) covers. "
        "A game whose runs are all incomplete (stopped before the episodes asked) is included: 'complete' says no "
        "and counts those games.\n\n"
        + table(["configuration", "games", "complete", "final (mean / median)", "best (mean / median)"], summary)
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
    rows.sort(key=lambda r: r[0] != "SZ-Tetris")  # the paper's order: SZ-Tetris first
    return f"### Elfwing et al. Table 3: softmax against ε-greedy selection\n\nSource: {paper['source']}.\n\n" + table(
        ["game", "selection", "episodes", "mean score (ours)", "paper", "exploratory actions (ours)", "paper", "run"],
        rows,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Obando-Ceron et al. 2024 (rliable)
AGENTS = {"drq-eps": "DrQ(ε)", "der": "DER", "full-rainbow": "Rainbow"}
# arguments that name, place or log a run without changing what it learns: never split variants
BOOKKEEPING = {"exp_name", "seed", "device", "torch_deterministic", "cuda_graph", "track", "wandb_project_name",
               "wandb_entity", "capture_video", "save_model", "checkpoint_replay", "resume", "write_every_minutes",
               "log_every_seconds", "snapshot_every", "analysis_every", "ntk_memory_mb", "save_replay",
               "save_replay_rows", "dataset_dir", "env_id", "load_model"}  # fmt: skip


def agent_of(s) -> str:
    a = s["args"]
    if kind(s) == "cql":
        return {"cql": "CQL", "cql-c51": "CQL+C51"}.get(a.get("agent", "cql"), a.get("agent", "cql"))
    if kind(s) == "rainbow":
        return AGENTS.get(a.get("preset"), a.get("preset", "Rainbow"))
    return "DQN"


def budget_asked(s) -> tuple[int, str]:
    a = s["args"]
    if kind(s) == "cql":
        return a.get("num_iterations", 0) * a.get("steps_per_iteration", 0), "gradient steps"
    return a.get("total_timesteps", 0), "agent steps"


def budget_reached(s) -> int:
    return s.get("updates", 0) if kind(s) == "cql" else s.get("global_step", 0)


def protocol_of(s) -> str:
    a = s["args"]
    if kind(s) == "cql":
        return f"offline on {a.get('data_percent', 100):g}% of each dataset file"
    return f"{a.get('protocol', 'dopamine')} protocol"


def suite_of(s):
    head, _, tail = s["args"].get("exp_name", "").partition(".")
    return head if head in suites.SUITES and tail else None


def variant_of(s) -> str:
    """The variant's name: the suite's variant where benchmark.sh launched the run, else its layer and its changes."""
    a = s["args"]
    if suite_of(s):
        return a["exp_name"].partition(".")[2]
    moe = a.get("moe", "none")
    if moe == "none":
        return "baseline" + (f" x{a['width_multiplier']}" if a.get("width_multiplier", 1) != 1 else "")
    v = {"softmoe": "Soft MoE", "top1": "Top1-MoE"}.get(moe, moe)
    v += f", {s.get('num_experts') or a.get('num_experts') or 8} experts"
    if a.get("tokenization", "perconv") != "perconv":
        v += f", {a['tokenization']}"
    if a.get("random_phi"):
        v += ", random Φ"
    if a.get("moe_normalize"):
        v += ", --moe-normalize"
    if a.get("phi_adam_eps") is not None:
        v += f", Φ's Adam ε {a['phi_adam_eps']:g}"
    return v


def signature(s) -> tuple:
    """What the run learned with: its arguments less the bookkeeping ones (None and absent alike)."""
    return tuple(sorted((k, json.dumps(v)) for k, v in s["args"].items() if k not in BOOKKEEPING and v is not None))


def eval_repeat_share(s):
    """The share of the last evaluation's episodes that scored its most common return (None without returns)."""
    ev = s.get("evaluations") or []
    returns = ev[-1].get("returns") if ev else None
    if not returns:
        return None
    return collections.Counter(returns).most_common(1)[0][1] / len(returns)


def paper_figure(c) -> str:
    """The paper figure a comparison stands for: its suite's, else by agent (CQL Fig. 11, 100k presets §5.2, else
    Fig. 1)."""
    if c["suite"]:
        return c["suite"]
    return {"CQL": "cql-fig11", "CQL+C51": "cql-fig11", "DrQ(ε)": "atari100k", "DER": "atari100k"}.get(
        c["agent"], "moe-fig1"
    )


def paper_budget(ref) -> tuple[int, str]:
    if "budget_steps" in ref:
        return ref["budget_steps"] // 4, "agent steps"
    if "budget_agent_steps" in ref:
        return ref["budget_agent_steps"], "agent steps"
    return ref["budget_gradient_steps"], "gradient steps"


def dedupe(rs):
    """A resumed run leaves one directory per segment: last_segments() drops those a --resume links; of the rest keep
    the furthest of each (experiment, game, seed, configuration), so two configurations under one name stay apart."""
    last = {}
    for r in rs:
        key = (r["args"].get("exp_name"), game_of(r), r["args"].get("seed"), signature(r))
        if key not in last or budget_reached(r) > budget_reached(last[key]):
            last[key] = r
    return list(last.values())


def comparisons(runs) -> list[dict]:
    """The MoE runs grouped into comparisons: the same suite (or experiment folder), agent, protocol, asked budget,
    encoder and games. Each: its key fields, variants {name: [summary]}, and a title."""
    groups = {}
    for s in last_segments(runs):
        if kind(s) in ("dqn", "rainbow", "cql"):
            origin = suite_of(s) or rel(experiment_dir(s))
            key = (origin, agent_of(s), protocol_of(s), budget_asked(s), s["args"].get("encoder", ""))
            groups.setdefault(key, []).append(s)
    out = []
    for (origin, agent, protocol, budget, encoder), rs in groups.items():
        rs = dedupe(rs)
        variants, sigs = {}, {}
        for r in rs:
            sigs.setdefault(variant_of(r), set()).add(signature(r))
        for r in rs:  # two configurations under one name: the arguments that tell them apart join the name
            name = variant_of(r)
            if len(sigs[name]) > 1:
                differ = [f"{k}={v}" for k, v in signature(r) if any((k, v) not in x for x in sigs[name])]
                name += " (" + ", ".join(differ) + ")"
            variants.setdefault(name, []).append(r)
        by_games = {}  # games that other variants cover are another comparison, of the variants that cover them
        for game in sorted({game_of(r) for r in rs}):
            names = frozenset(n for n, vrs in variants.items() if any(game_of(r) == game for r in vrs))
            by_games.setdefault(names, []).append(game)
        by_games = {
            tuple(games): {n: [r for r in variants[n] if game_of(r) in games] for n in sorted(names)}
            for names, games in by_games.items()
        }
        for games, vs in by_games.items():
            n, unit = budget
            names = ", ".join(games) if len(games) <= 4 else f"{len(games)} games"
            enc = encoder.capitalize() or "default"
            title = f"{agent}, {enc} encoder, {names}, {n:,} {unit}, {protocol} ({origin})"
            short = f"{agent} · {enc} · {names} · {n:,} {unit.split()[0]} steps\n{origin}"
            suite = suite_of(next(iter(vs.values()))[0])
            out.append(dict(suite=suite, origin=origin, agent=agent, protocol=protocol, budget=budget,
                            encoder=encoder, games=games, variants=vs, title=title, short=short))  # fmt: skip
    for c in out:
        ref = PAPER["moe_figures"].get(paper_figure(c), {})
        c["fraction"] = c["budget"][0] / paper_budget(ref)[0] if ref else 0.0
    # the suites, then the largest share of the paper's budget, the paper's encoder (Impala) first
    out.sort(key=lambda c: (c["suite"] is None, c["suite"] or "", -c["fraction"], c["encoder"] != "impala",
                            c["origin"], c["agent"], c["games"]))  # fmt: skip
    return out


def span(lo, hi) -> str:
    """'84%–94%', or '90%' where both ends are one."""
    return f"{lo:.0%}" if f"{lo:.0%}" == f"{hi:.0%}" else f"{lo:.0%}–{hi:.0%}"


def fixed_measure(c) -> str | None:
    """The measure an experiment's own test fixed in advance: "measure" in the aggregate.json of its folder (as
    results/atari100k_26games/aggregate.py writes), so that the report scores what that test reads; None where the
    folder has no aggregate.json or it names no measure."""
    if c["suite"]:
        return None
    path = os.path.join(ROOT, c["origin"], "aggregate.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            measure = json.load(f).get("measure")
    except (OSError, ValueError, AttributeError) as e:
        why = f"error: {rel(path)} is not a readable aggregate.json ({e}); rerun the aggregate.py beside it"
        raise SystemExit(why) from None
    if measure not in (None, "evaluation", "training"):
        raise SystemExit(f'error: {rel(path)} names the measure {measure!r}; it must be "evaluation" or "training"')
    return measure


def choose_measure(c) -> tuple[str, str]:
    """('evaluation' | 'training', why) for a comparison: CQL's evaluation; the measure the experiment's test fixed,
    where it fixed one (fixed_measure); else an online run's last evaluation where the runs have one, unless some
    evaluation is about one game played again (most of its episodes score one return, as under the Atari-100k
    protocol's deterministic starts); then, and without evaluations, the mean return of the last 100 training episodes
    (Dopamine's continuous_train reporting)."""
    rs = [r for vrs in c["variants"].values() for r in vrs]
    if c["agent"] in ("CQL", "CQL+C51"):
        return "evaluation", "the final evaluation (CQL's only score)"
    evaluated = [r for r in rs if r.get("evaluations")]
    shares = [x for x in (eval_repeat_share(r) for r in evaluated) if x is not None]
    repeats = [x for x in shares if x >= ONE_TRAJECTORY]
    covers = (
        f"in {len(repeats)} of {len(shares)} runs one return covers {span(min(repeats), max(repeats))} of its "
        f"episodes (rule: ≥ {ONE_TRAJECTORY:.0%})"
        if repeats
        else ""
    )
    fixed = fixed_measure(c)
    if fixed == "training":
        return "training", "the mean return of the last 100 training episodes, the measure this experiment's test fixed"
    if fixed == "evaluation":
        why = "the last evaluation's mean return, the measure this experiment's test fixed (its aggregate.json)"
        if repeats:
            why += f"; {covers}, so those evaluations are about one trajectory each"
        return "evaluation", why
    if not evaluated:
        return "training", "the mean return of the last 100 training episodes (no evaluation in these runs)"
    if repeats:
        n = evaluated[0]["evaluations"][-1].get("episodes", len(evaluated[0]["evaluations"][-1].get("returns", [])))
        return "training", (
            f"the mean return of the last 100 training episodes. The evaluation ({n} episodes) is shown beside it but "
            f"not scored: {covers}, so each evaluation is about one trajectory per seed"
        )
    return "evaluation", "the last evaluation's mean return"


def score_of(s, measure) -> tuple:
    """(human-normalised, raw) score of a run under the comparison's measure; (None, None) where it has none yet."""
    if kind(s) == "cql":
        return s.get("eval_human_normalized_score"), s.get("eval_mean_return")
    if measure == "evaluation":
        ev = s.get("evaluations") or []
        if ev and ev[-1].get("human_normalized_score") is not None:
            return ev[-1]["human_normalized_score"], ev[-1].get("mean_return")
        return None, None
    return s.get("human_normalized_score"), s.get("mean_return_last_100")


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


def can_bootstrap(m) -> bool:
    """The interval rule: at least MIN_RUNS_FOR_CI runs (games x seeds) and MIN_SEEDS_FOR_CI seeds per game."""
    return m.size >= MIN_RUNS_FOR_CI and m.shape[0] >= MIN_SEEDS_FOR_CI


def iqm_with_ci(matrices: dict, reps: int, seed: int = 0):
    """rliable: IQM point estimate and 95% stratified bootstrap CI per key."""
    from rliable import library as rly
    from rliable import metrics

    np.random.seed(seed)
    point, ci = rly.get_interval_estimates(matrices, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=reps)
    return {k: (float(point[k][0]), float(ci[k][0][0]), float(ci[k][1][0])) for k in matrices}


def score_comparison(c, reps):
    """Scores each variant of c: sets c['measure'], c['why'], c['matrices'], c['est'] {variant: (iqm, lo, hi)} (lo
    and hi None where too few runs), c['info'] and c['unscored']."""
    from rliable import metrics

    c["measure"], c["why"] = choose_measure(c)
    c["matrices"], c["info"], c["unscored"] = {}, {}, []
    baseline_first = sorted(
        c["variants"].items(), key=lambda kv: ("none" not in kv[0] and "baseline" not in kv[0], kv[0])
    )
    for var, rs in baseline_first:
        done = [r for r in rs if r.get("complete")]
        for r in rs:
            if done and not r.get("complete"):  # a run still going (or stopped) beside finished ones: not yet a result
                n, unit = budget_asked(r)
                c["unscored"].append(f"{var} {game_of(r)} seed {r['args'].get('seed')} (incomplete: "
                                     f"{budget_reached(r):,} of {n:,} {unit})")  # fmt: skip
        use = done or rs
        entries = [(game_of(r), r["args"].get("seed"), score_of(r, c["measure"])[0]) for r in use]
        c["unscored"] += [f"{var} {g} seed {sd} (no score yet)" for g, sd, sc in entries if sc is None]
        scored = [e for e in entries if e[2] is not None]
        if not scored:
            continue
        m, games, dropped = score_matrix(scored)
        if m.size:
            c["matrices"][var] = m
            c["info"][var] = (games, m.shape[0], dropped, use)
    eligible = {k: m for k, m in c["matrices"].items() if can_bootstrap(m)}
    est = iqm_with_ci(eligible, reps) if eligible else {}
    c["est"] = {k: est.get(k, (float(metrics.aggregate_iqm(m)), None, None)) for k, m in c["matrices"].items()}


def bar_label(c, var) -> str:
    """games x seeds, 'no CI' where the interval rule left it out, and the steps reached where runs are incomplete."""
    m, lo, rs = c["matrices"][var], c["est"][var][1], c["info"][var][3]
    label = seeds_label(m) + ("" if lo is not None else ", no CI")
    if not all(r.get("complete") for r in rs):
        lo_n, hi_n = (short_number(x) for x in (min(map(budget_reached, rs)), max(map(budget_reached, rs))))
        label += f"\nincomplete: {lo_n if lo_n == hi_n else f'{lo_n}–{hi_n}'} of {short_number(c['budget'][0])} steps"
    return label


def short_number(n) -> str:
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}k" if n >= 1e3 else f"{n}"


def seeds_label(m) -> str:
    """games x seeds of a (runs x games) matrix."""
    return f"{m.shape[1]}×{m.shape[0]}"


def comparison_text(c) -> str:
    fig = paper_figure(c)
    ref = PAPER["moe_figures"].get(fig, {})
    n, unit = c["budget"]
    text = [f"### Soft MoE paper{', ' + c['suite'] if c['suite'] else ''}: {c['title']}"]
    if ref:
        pn, punit = paper_budget(ref)
        seeds = sorted({m.shape[0] for m in c["matrices"].values()})
        seeds_txt = "–" if not seeds else (f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}–{seeds[-1]}")
        text.append(
            f"Paper: {ref['paper']}. Source: {ref['source']}.\n\nScope: {len(c['games'])} of the paper's "
            f"{ref['games']} games ({', '.join(c['games']) if len(c['games']) <= 5 else 'listed below'}), {seeds_txt} "
            f"of its {ref['seeds']} seeds per variant and game; {n:,} {unit} per run against the paper's {pn:,} "
            f"{punit} ({100 * n / pn:.3g}%); {c['protocol']}; {c['encoder'] or 'default'} encoder."
        )
    if not c["suite"] and c["encoder"] == "impala" and any(v.startswith("Soft MoE, 8 experts") for v in c["variants"]):
        text.append("The network is the reference code's Impala encoder with a Soft MoE of 8 experts (the expert count "
                    "of the paper's Fig. 12, which is at 50M agent steps).")  # fmt: skip
    if not c["matrices"]:
        text.append("No run has a score yet.")
        return "\n\n".join(text)
    text.append(f"Measure: {c['why']}; human-normalised, IQM over games × seeds.")
    rows = []
    for var, m in c["matrices"].items():
        games, nseeds, dropped, rs = c["info"][var]
        iqm, lo, hi = c["est"][var]
        reached = sorted({budget_reached(r) for r in rs})
        reach = f"{reached[0]:,}" if len(reached) == 1 else f"{reached[0]:,}–{reached[-1]:,}"
        ci = f"[{lo:.3f}, {hi:.3f}]" if lo is not None else f"– ({m.size} run{'s' if m.size > 1 else ''})"
        rows.append([var, f"{iqm:.3f}", ci, seeds_label(m), f"{reach} / {n:,} {unit}",
                     sum(bool(r.get("complete")) for r in rs), dropped])  # fmt: skip
    text.append(table(["variant", "IQM", "95% CI", "games × seeds", "budget (ours / asked)", "complete runs",
                       "runs left out (uneven seeds)"], rows))  # fmt: skip
    if len(c["games"]) <= 5 or c["agent"] in ("DrQ(ε)", "DER"):
        text.append(per_game(c))
    if c["unscored"]:
        u = c["unscored"]
        text.append("Not scored: " + ", ".join(u[:20]) + (f" and {len(u) - 20} more" if len(u) > 20 else ""))
    return "\n\n".join(text)


def per_game(c) -> str:
    """Per game and variant: each seed's raw score under the comparison's measure, their mean, the evaluation beside
    a training measure, and the published mean of DrQ(eps) or DER at 100k."""
    key = {"DrQ(ε)": "drq_eps_atari100k", "DER": "der_atari100k"}.get(c["agent"])
    ref = PAPER[key] if key and c["budget"][0] == 100_000 else None
    show_eval = c["measure"] == "training" and any(
        r.get("evaluations") for rs in c["variants"].values() for r in rs
    )  # fmt: skip
    show_training = c["measure"] == "evaluation" and fixed_measure(c) == "evaluation"  # the test's table has both
    rows = []
    for var in c["matrices"]:
        rs = c["info"][var][3]
        for game in sorted({game_of(r) for r in rs}):
            grs = sorted((r for r in rs if game_of(r) == game), key=lambda r: r["args"].get("seed", 0))
            raw = [(r["args"].get("seed"), score_of(r, c["measure"])[1]) for r in grs]
            raw = [(sd, x) for sd, x in raw if x is not None]
            if not raw:
                continue
            row = [var, game, ", ".join(f"{fmt(x)} (s{sd})" for sd, x in raw), fmt(float(np.mean([x for _, x in raw])))]
            if show_eval:
                row.append(", ".join(fmt(score_of(r, "evaluation")[1]) for r in grs))
            if show_training:
                row.append(", ".join(fmt(score_of(r, "training")[1]) for r in grs))
            if ref:
                row.append(fmt(ref["games"].get(game)))
            rows.append(row)
    what = "last 100 training episodes" if c["measure"] == "training" else "evaluation"
    header = ["variant", "game", f"raw score per seed ({what})", "mean"]
    header += ["evaluation per seed (~1 trajectory each)"] if show_eval else []
    header += ["training per seed (last 100 episodes, or all if fewer)"] if show_training else []
    header += [f"{c['agent']} published (evaluation)"] if ref else []
    src = f" Published means: {ref['source'].rstrip('.')}." if ref else ""
    return f"Per game and seed.{src}\n\n" + table(header, rows)


def moe_tables(runs, out_dir, reps, plots) -> list[str]:
    cs = comparisons(runs)
    if not cs:
        return []
    for c in cs:
        score_comparison(c, reps)
    rules = (
        "### Soft MoE paper: how the runs are compared\n\nRuns share a comparison (one table, one chart panel) only "
        "where they share the suite or results folder, agent, protocol, budget asked, encoder and games; a variant "
        "is one configuration (its arguments less seed and bookkeeping). Score: the IQM of human-normalised scores "
        "over games × seeds (rliable). 95% CI: stratified bootstrap (rliable, "
        f"{reps} reps), drawn only for a variant with at least {MIN_RUNS_FOR_CI} runs (games × seeds) and at least "
        f"{MIN_SEEDS_FOR_CI} seeds per game, else '–'. Where a variant has complete runs, its incomplete ones (in "
        "progress or stopped) are not scored. The measure of each comparison is stated with it."
    )
    sections = [rules]
    if plots:
        sections.append("\n\n".join(make_plots(cs, out_dir)))
    sections += [comparison_text(c) for c in cs]
    return sections


# ---------------------------------------------------------------------------------------------------------------------
# Plots
def single(n) -> str:
    return f"{n} comparison of one variant is" if n == 1 else f"{n} comparisons of one variant are"


def make_plots(cs, out_dir) -> list[str]:
    """One chart of IQM bars with a panel per comparison of two or more variants; the expert-count scaling of Fig. 1;
    performance profiles where every variant has enough runs; learning curves, a row per comparison."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    links = []
    panels = [c for c in cs if len(c["matrices"]) >= 2]
    rule = (f"bars: IQM of human-normalised scores, labelled games × seeds; error bars: 95% stratified bootstrap CI, "
            f"drawn only with ≥ {MIN_RUNS_FOR_CI} runs and ≥ {MIN_SEEDS_FOR_CI} seeds per game")  # fmt: skip
    if panels:
        heights = [0.45 * len(c["matrices"]) + 1.0 for c in panels]
        f, axes = plt.subplots(len(panels), 1, figsize=(8, sum(heights) + 0.6), height_ratios=heights, squeeze=False)
        for ax, c in zip(axes[:, 0], panels, strict=True):
            names = list(c["matrices"])
            est = [c["est"][n] for n in names]
            y = np.arange(len(names))
            ax.barh(y, [e[0] for e in est], color="tab:blue", alpha=0.7)
            ends = [v for e in est for v in e if v is not None] + [0.0]
            lo_x, hi_x = min(ends), max(ends)
            pad = 0.05 * (hi_x - lo_x or 1.0)
            for i, (n, (iqm, lo, hi)) in enumerate(zip(names, est, strict=True)):
                if lo is not None:
                    ax.errorbar(iqm, i, xerr=[[iqm - lo], [hi - iqm]], color="black", capsize=3, lw=1)
                ax.annotate(bar_label(c, n), (max(iqm, hi if hi is not None else iqm, 0), i), xytext=(4, 0),
                            textcoords="offset points", va="center", fontsize=7)  # fmt: skip
            ax.set_xlim(lo_x - pad, hi_x + 0.5 * (hi_x - lo_x or 1.0))  # room for the labels right of the bars
            ax.set_yticks(y, names, fontsize=8)
            ax.invert_yaxis()
            ax.axvline(0, color="grey", lw=0.5)
            what = "training, last 100 episodes" if c["measure"] == "training" else "evaluation"
            ax.set_title(c["short"] + f" · {what}", fontsize=9)
        axes[-1, 0].set_xlabel("IQM human-normalised score")
        f.text(0.01, 0.003, rule, fontsize=7, va="bottom")
        f.tight_layout(rect=(0, 0.02, 1, 1))
        path = os.path.join(out_dir, "moe_iqm.png")
        f.savefig(path, dpi=100)
        plt.close(f)
        alone = single(len(cs) - len(panels))
        links.append(
            f"![IQM per comparison]({os.path.basename(path)})\n\nOne panel per comparison of two or more variants "
            f"({len(panels)}; {alone} in the tables only); {rule}."
        )
    fig1 = {k: v for c in cs if c["suite"] == "moe-fig1" for k, v in c["est"].items()}
    if fig1:  # the expert-count scaling of Fig. 1
        f, ax = plt.subplots(figsize=(6, 4))
        for algo in ("dqn", "rainbow"):
            for tag, label in (("softmoe-e", "Soft MoE, experts"), ("none-x", "baseline, width x")):
                ks = [k for k in (1, 2, 4, 8) if f"{algo}-{tag}{k}" in fig1]
                if ks:
                    e = [fig1[f"{algo}-{tag}{k}"] for k in ks]
                    yv = np.array([v[0] for v in e])
                    yerr = np.array([[v[0] - (v[1] if v[1] is not None else v[0]) for v in e],
                                     [(v[2] if v[2] is not None else v[0]) - v[0] for v in e]])  # fmt: skip
                    ax.errorbar(ks, yv, yerr=yerr, marker="o", capsize=3, label=f"{algo}: {label}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("experts / width multiplier")
        ax.set_ylabel("IQM human-normalised score")
        ax.legend(fontsize=8)
        f.tight_layout()
        path = os.path.join(out_dir, "moe-fig1_scaling.png")
        f.savefig(path, dpi=100)
        plt.close(f)
        links.append(f"![expert scaling]({os.path.basename(path)})")
    profiled = [c for c in panels if all(can_bootstrap(m) for m in c["matrices"].values())]
    if profiled:  # performance profiles (rliable)
        try:
            from rliable import library as rly
            from rliable import plot_utils

            taus = np.linspace(-0.5, 2.0, 51)
            f, axes = plt.subplots(1, len(profiled), figsize=(6 * len(profiled), 4), squeeze=False)
            for ax, c in zip(axes[0], profiled, strict=True):
                profiles, cis = rly.create_performance_profile(c["matrices"], taus, reps=200)
                plot_utils.plot_performance_profiles(profiles, taus, performance_profile_cis=cis, ax=ax,
                                                     xlabel=r"human-normalised score $(\tau)$")  # fmt: skip
                ax.set_title(c["short"], fontsize=9)
                ax.legend(ax.get_lines()[: len(profiles)], list(profiles), fontsize=7)
            f.tight_layout()
            path = os.path.join(out_dir, "moe_profiles.png")
            f.savefig(path, dpi=100)
            plt.close(f)
            links.append(f"![performance profiles]({os.path.basename(path)}) (comparisons whose every variant has "
                         "an interval)")  # fmt: skip
        except Exception as e:  # a profile needs scores that vary; say why instead of stopping the report
            links.append(f"(performance profiles not drawn: {type(e).__name__}: {e})")
    # learning curves: a row per comparison, a column per game, seeds shaded (min to max over seeds)
    curves = {}  # (comparison index, game, variant) -> [(x, y)]
    for k, c in enumerate(cs):
        for var in c["matrices"]:
            for r in c["info"][var][3]:
                xy = episode_curve(r)
                if xy is not None:
                    curves.setdefault((k, game_of(r), var), []).append(xy)
    rows = [(k, c) for k, c in enumerate(cs) if any(key[0] == k for key in curves)]
    if rows:
        ncol = max(len(c["games"]) for _, c in rows)
        f, axes = plt.subplots(len(rows), ncol, figsize=(4.5 * ncol, 3.2 * len(rows)), squeeze=False)
        for row, (k, c) in zip(axes, rows, strict=True):
            for j, ax in enumerate(row):
                if j >= len(c["games"]):
                    ax.axis("off")
                    continue
                game = c["games"][j]
                for var in c["matrices"]:
                    xys = curves.get((k, game, var))
                    if not xys:
                        continue
                    grid = np.linspace(0, max(x[-1] for x, _ in xys), 50)
                    ys = np.array([np.interp(grid, x, yv) for x, yv in xys])
                    (line,) = ax.plot(grid, ys.mean(0), label=f"{var} ({len(xys)})")
                    ax.fill_between(grid, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.2)
                n, unit = c["budget"]
                ax.set_title(f"{game} · {c['agent']} · {c['encoder']} · {short_number(n)} {unit}\n{c['origin']}",
                             fontsize=8)  # fmt: skip
                ax.set_xlabel(unit, fontsize=8)
                ax.tick_params(labelsize=7)
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize=6)
            row[0].set_ylabel("evaluation return" if c["agent"].startswith("CQL") else "training return")
        f.tight_layout()
        path = os.path.join(out_dir, "moe_curves.png")
        f.savefig(path, dpi=70)
        plt.close(f)
        links.append(f"![learning curves]({os.path.basename(path)}) (a row per comparison, seeds shaded min to max)")
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
def run_budget(s) -> int:
    """The budget a training run asked: episodes (Tetris, Sarsa), else agent or gradient steps."""
    return s["args"].get("total_episodes") if kind(s) in ("tetris", "sarsa") else budget_asked(s)[0]


def task_budget(t) -> int:
    """The budget of a task of runs/suites/<suite>.json, from the command line it records: --total-episodes (Tetris,
    Sarsa), else the steps suites.py costs it at (with the scripts' and presets' defaults)."""
    if os.path.basename(t["argv"][1]) in ("td_lambda_tetris.py", "sarsa_lambda_silu_atari.py"):
        return int(suites._value(t["argv"], "--total-episodes", "200000"))
    fields = {f: t[f] for f in ("suite", "game", "variant", "seed", "argv", "log", "then", "seconds") if f in t}
    return int(suites.task_cost(suites.Task(**fields)).amount)


def task_status(suite: str, runs) -> str:
    path = os.path.join(ROOT, "runs", "suites", f"{suite}.json")
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        manifest = json.load(f)
    found = {}  # (experiment, game, seed, budget asked) -> the newest training summary
    for s in runs:
        if kind(s) not in TRAINING:  # an evaluation (sarsa_analysis.py, tetris_eval.py) names the run it evaluated
            continue
        a = s["args"]
        key = (a.get("exp_name"), game_of(s), a.get("seed"), run_budget(s))
        if key not in found or os.path.getmtime(s["_path"]) > os.path.getmtime(found[key]["_path"]):
            found[key] = s
    rows, counts = [], {}
    for t in manifest["tasks"]:
        s = found.get((t["exp_name"], t["game"], t["seed"], task_budget(t)))
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
    p.add_argument("--include-superseded", action="store_true", help="keep the runs of folders marked superseded")
    args = p.parse_args(argv)
    if args.reps < 1:
        raise SystemExit(f"error: --reps must be at least 1, got {args.reps}")
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
    unreadable = []
    runs = find_summaries(dirs, unreadable)
    settled = [] if wanted else find_table1(dirs, unreadable)
    if wanted:
        runs = [s for s in runs if s["args"].get("exp_name", "").partition(".")[0] in wanted]
    status = [x for x in (task_status(s, runs) for s in wanted) if x]
    if not runs and not status and not settled:
        where = ", ".join(dirs) if dirs else "runs"
        of = f" for {', '.join(wanted)}" if wanted else ""
        why = f"; {len(unreadable)} unreadable, e.g. {unreadable[0].split(': ', 1)[1]}" if unreadable else ""
        raise SystemExit(f"error: nothing to report: no summary.json in {where}{of}{why}")
    left_out = {}  # folder -> (its "Superseded by" line, runs)
    if not args.include_superseded:
        for s in runs:
            if superseded(s):
                left_out.setdefault(rel(experiment_dir(s)), [superseded(s), 0])[1] += 1
        runs = [s for s in runs if not superseded(s)]
    sections = [x for x in (elfwing_table1(runs, settled), elfwing_table2(runs), elfwing_table3(runs)) if x]
    sections += moe_tables(runs, args.out, args.reps, not args.no_plots)
    sections += status
    if left_out:
        sections.append(
            "### Left out: superseded\n\nFolders whose README.md says they are superseded "
            "(`--include-superseded` reports them):\n\n"
            + "\n".join(f"- {d} ({n} summaries): {unlink(line)}" for d, (line, n) in sorted(left_out.items()))
        )
    if unreadable:
        sections.append("### Left out: unreadable\n\n" + "\n".join(f"- {line}" for line in unreadable))
    text = (f"# Report: {len(runs)} runs" + (f" and {len(settled)} settled Table 1" if settled else "")
            + f" from {', '.join(dirs)}\n\n" + "\n\n".join(sections) + "\n")  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(text)
    print(text)
    print(f"(written to {os.path.join(args.out, 'report.md')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
