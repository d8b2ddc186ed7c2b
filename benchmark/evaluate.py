"""Evaluate or watch a checkpoint of any of the five scripts in one command, without learning.

    python benchmark/evaluate.py runs/<run>/<script>.pt --episodes 10 [--capture-video] [--epsilon E] [--seed S]

The checkpoint's own format says which script wrote it; the game, protocol and network are its run's. The policy is
the run's evaluation policy, or the paper's where it states one:
- dqn_softmoe: epsilon-greedy at 0.001 (Dopamine's dqn.gin, DQNAgent.epsilon_eval; the paper's DQN is Dopamine's);
- rainbow_softmoe, cql_softmoe: epsilon-greedy at the run's --eval-epsilon in eval mode (NoisyNets' means), as the
  scripts' own evaluate();
- sarsa_lambda_silu_atari: softmax at the checkpoint's final temperature tau(i) (Elfwing et al. §4.2, Table 3's first
  rule), played by benchmark/sarsa_analysis.py's evaluate;
- td_lambda_tetris: softmax at the final temperature, the best run of the checkpoint's activation (Table 3), played by
  benchmark/tetris_eval.py (--activation picks one of a multi-activation checkpoint, --run another run).
--epsilon E makes any of them epsilon-greedy at E. Atari games play --episodes games at once, one per environment,
each to its end (no step budget), their no-op starts and emulators seeded from --seed (default: the run's).

Prints every episode's return (Tetris: lines cleared) and length (agent steps; Tetris: placements), their mean and
sd, and for Atari the human-normalised mean score (and Sarsa's DQN-normalised one); appends the evaluation to
evaluation.json beside the checkpoint (earlier evaluations are kept). --capture-video writes evaluation.mp4 beside it:
env 0's first game as the agent sees it (Atari only; needs moviepy).
"""

import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "algos"), os.path.join(ROOT, "benchmark")]
from envs import atari, exit_if_damaged  # noqa: E402

SCRIPTS = ("dqn_softmoe", "rainbow_softmoe", "cql_softmoe", "sarsa_lambda_silu_atari", "td_lambda_tetris")
DQN_EVAL_EPSILON = 0.001  # Dopamine's dqn.gin: DQNAgent.epsilon_eval


@dataclass
class Args:
    checkpoint: tyro.conf.Positional[str]
    """a checkpoint of one of the five scripts (--save-model's runs/<run>/<script>.pt, or a snapshot's)"""
    episodes: int = 10
    """episodes to play (Tetris: per evaluated run)"""
    epsilon: float | None = None
    """epsilon-greedy at this epsilon instead of the run's evaluation policy"""
    capture_video: bool = False
    """write evaluation.mp4 beside the checkpoint (Atari: env 0's first game)"""
    seed: int | None = None
    """the evaluation's seed (default: the run's)"""
    device: str = "auto"
    """'auto', 'cpu' or 'cuda'"""
    activation: str | None = None
    """td_lambda_tetris: which activation's runs of a checkpoint that trained several"""
    run: str = "best"
    """td_lambda_tetris: 'best', 'all' or a run index"""


def read(cli: Args) -> tuple[str, dict]:
    """The script that wrote the checkpoint, and the checkpoint; one line (SystemExit) for anything wrong."""
    if cli.episodes < 1:
        raise SystemExit("error: --episodes must be at least 1")
    if cli.epsilon is not None and not 0 <= cli.epsilon <= 1:
        raise SystemExit(f"error: --epsilon must lie in [0, 1], got {cli.epsilon}")
    if cli.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"error: --device {cli.device} asked for CUDA but torch sees no GPU; use --device cpu or auto")
    if cli.capture_video and not importlib.util.find_spec("moviepy"):
        raise SystemExit("error: --capture-video needs moviepy; `pip install moviepy` or drop --capture-video")
    if not os.path.isfile(cli.checkpoint):
        raise SystemExit(f"error: {cli.checkpoint!r}: no such file")
    exit_if_damaged(cli.checkpoint, "")
    try:
        ckpt = torch.load(cli.checkpoint, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  (any unpickling failure means the file is not a checkpoint)
        raise SystemExit(f"error: {cli.checkpoint!r} is not a readable checkpoint ({type(err).__name__})") from None
    found = ckpt.get("format") if isinstance(ckpt, dict) else None
    script = found.split("/")[0] if isinstance(found, str) else None
    if script not in SCRIPTS and isinstance(ckpt, dict) and ckpt.get("script") in SCRIPTS:
        script = ckpt["script"]  # a moe_analysis snapshot
    if script not in SCRIPTS:
        raise SystemExit(f"error: {cli.checkpoint!r} is not a checkpoint of {', '.join(SCRIPTS)}")
    if cli.capture_video and script == "td_lambda_tetris":
        raise SystemExit("error: --capture-video plays Atari games only; Tetris has no renderer here")
    return script, ckpt


def atari_moe(cli: Args, script: str, ckpt: dict, device, video: str | None) -> dict:
    """dqn / rainbow / cql: the run's network in eval mode, acting with the script's own network_inputs and
    select_actions through envs/atari.py's evaluation loop."""
    module = __import__(script)
    known = {k: v for k, v in ckpt["args"].items() if k in module.Args.__dataclass_fields__}  # older flags dropped
    args = module.fill_defaults(module.Args(**known))
    rom = atari.game_from_env_id(args.env_id)
    q_net = module.build_network(args, atari.num_game_actions(rom)).to(device)
    try:
        q_net.load_state_dict(ckpt["q_net"])
    except RuntimeError as err:
        raise SystemExit(f"error: {cli.checkpoint!r} does not fit its own Args ({err})".splitlines()[0]) from None
    q_net.eval()  # evaluation: NoisyNets' means (rainbow), a dropout fork's mean network
    default = DQN_EVAL_EPSILON if script == "dqn_softmoe" else args.eval_epsilon
    epsilon = default if cli.epsilon is None else cli.epsilon
    seed = args.seed if cli.seed is None else cli.seed
    rng = np.random.default_rng(seed)

    def act(obs, tracker, live):
        inputs = {k: v[live] for k, v in module.network_inputs(obs, tracker).items()}
        return module.select_actions(q_net, inputs, epsilon, rng, q_net.num_actions, device)[0]

    games = atari.evaluate(act, args.protocol, rom, cli.episodes, args.max_episode_frames, seed, rng, None, video)
    returns = [float(r) for r, _ in games]
    return {
        "game": atari.camel_name(rom),
        "protocol": args.protocol,
        "policy": f"epsilon-greedy, epsilon {epsilon:g}",
        "seed": seed,
        "global_step": ckpt.get("global_step"),
        "updates": ckpt.get("updates"),
        "episode_returns": returns,
        "episode_lengths": [int(n) for _, n in games],
        "human_normalized_score": atari.human_normalized(float(np.mean(returns)), rom),
    }


def sarsa_agent(cli: Args, ckpt: dict, video: str | None) -> dict:
    """Sarsa(lambda): benchmark/sarsa_analysis.py's evaluation (no learning), softmax at the final temperature."""
    import sarsa_analysis

    seed = ckpt["args"]["seed"] if cli.seed is None else cli.seed
    num_envs = min(cli.episodes, ckpt["args"].get("num_envs", 1))
    train, device, base, params, final_tau = sarsa_analysis.agent(ckpt, num_envs, seed, cli.device)
    kind, x = ("softmax", final_tau) if cli.epsilon is None else ("epsilon", cli.epsilon)
    game = ckpt["architecture"]["game"]
    result, _ = sarsa_analysis.evaluate(train, game, base, params, kind, x, device, cli.episodes, video=video)
    return {
        "game": atari.camel_name(game),
        "protocol": "Elfwing et al.'s Atari protocol (the run's Args)",
        "policy": f"softmax, tau {x:.4g} (the final temperature)" if kind == "softmax" else f"epsilon-greedy, {x:g}",
        "seed": seed,
        "global_step": ckpt["global_step"],
        "training_episodes": ckpt["episodes"],
        "episode_returns": [float(s) for s in result["episode_scores"]],
        "episode_lengths": [int(n) for n in result["episode_lengths"]],
        "human_normalized_score": atari.human_normalized(result["mean_score"], game),
        "dqn_normalized_score": result["dqn_normalized"],
        "exploratory_actions_per_episode": result["exploratory_actions_per_episode"],
    }


def tetris_agent(cli: Args, ckpt: dict) -> dict:
    """TD(lambda) on Tetris: benchmark/tetris_eval.py's play (no learning), softmax at the final temperature."""
    import tetris_eval

    rule = "softmax" if cli.epsilon is None else f"epsilon:{cli.epsilon}"
    seed = ckpt["args"]["seed"] if cli.seed is None else cli.seed
    opts = tetris_eval.Args(
        checkpoint=cli.checkpoint,
        activation=cli.activation,
        run=cli.run,
        episodes=cli.episodes,
        selections=(rule,),
        value_analysis_episodes=0,
        seed=seed,
        device=cli.device,
    )
    tetris_eval.validate(opts)
    summary = tetris_eval.play(opts, None)
    ((key, result),) = summary["eval"].items()
    return {
        "game": ckpt["env_id"],
        "protocol": "the run's Tetris variant",
        "policy": f"softmax, tau {summary['final_temperature']:.4g} (the final temperature)"
        if key.startswith("softmax")
        else f"epsilon-greedy, {cli.epsilon:g}",
        "seed": seed,
        "activation": summary["activation"],
        "runs": summary["eval_runs"],
        "episode_returns": [float(s) for run in result["episode_scores"] for s in run],
        "episode_lengths": [int(n) for run in result["episode_lengths"] for n in run],
        "exploratory_actions_per_episode": result["exploratory_actions_per_episode"],
    }


def main(cli: Args) -> dict:
    script, ckpt = read(cli)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if cli.device == "auto" else cli.device)
    folder = os.path.dirname(os.path.abspath(cli.checkpoint))
    video = os.path.join(folder, "evaluation.mp4") if cli.capture_video else None
    start = time.time()
    if script == "td_lambda_tetris":
        result = tetris_agent(cli, ckpt)
    elif script == "sarsa_lambda_silu_atari":
        result = sarsa_agent(cli, ckpt, video)
    else:
        result = atari_moe(cli, script, ckpt, device, video)
    returns, lengths = np.array(result["episode_returns"]), np.array(result["episode_lengths"])
    result = {
        "script": script,
        "checkpoint": os.path.basename(cli.checkpoint),
        "episodes": len(returns),
        "mean_return": float(returns.mean()),
        "std_return": float(returns.std()),
        "mean_length": float(lengths.mean()),
        **result,
        "video": os.path.basename(video) if video else None,
        "seconds": time.time() - start,
        "command": " ".join(sys.argv),
    }
    unit = "lines" if script == "td_lambda_tetris" else "return"
    for i, (r, n) in enumerate(zip(returns, lengths, strict=True)):
        print(f"episode {i + 1}: {unit} {r:g}, length {n}")
    line = f"{script} on {result['game']}, {result['policy']}: mean {unit} {result['mean_return']:.2f} ± "
    line += f"{result['std_return']:.2f} (sd) over {len(returns)} episodes, mean length {result['mean_length']:.1f}"
    if result.get("human_normalized_score") is not None:
        line += f"; human-normalised {result['human_normalized_score']:.3f}"
    if result.get("dqn_normalized_score") is not None:
        line += f"; DQN-normalised {result['dqn_normalized_score']:.3f}"
    print(line)
    path = os.path.join(folder, "evaluation.json")
    record = {"evaluations": []}
    if os.path.exists(path):  # earlier evaluations of this checkpoint (other seeds, policies) are kept
        with open(path) as f:
            record = json.load(f)
    record["evaluations"].append(result)
    with open(f"{path}.tmp", "w") as f:
        json.dump(record, f, indent=2)
    os.replace(f"{path}.tmp", path)
    print(f"wrote {path}" + (f" and {video}" if video else ""))
    return result


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__.split("\n\n")[0]))
