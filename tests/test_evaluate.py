"""benchmark/evaluate.py: a checkpoint of each script played without learning under its run's evaluation policy, the
script's own evaluation reproduced, evaluation.json kept across calls, a wrong or damaged file refused in one line."""

import json
import os
from dataclasses import asdict

import numpy as np
import pytest
import torch

import cql_softmoe as cql
import dqn_softmoe as dqn
import evaluate
import rainbow_softmoe as rb
import sarsa_lambda_silu_atari as sarsa
import td_lambda_tetris as td
from damage import flip_bytes
from envs import atari

SMALL = dict(env_id="ALE/Breakout-v5", encoder="nature", num_experts=2, expert_width=16, max_episode_frames=400)


def saved_network(module, args, path) -> str:
    """A checkpoint as the script writes it, as far as an evaluation reads it: format, args, architecture, q_net."""
    torch.manual_seed(0)
    net = module.build_network(args, 4)
    ckpt = {"format": f"{module.SCRIPT}/2", "args": asdict(args), "architecture": module.architecture(args)}
    torch.save(ckpt | {"q_net": net.state_dict(), "global_step": 0, "updates": 0}, path)
    return str(path)


@pytest.mark.parametrize("module", [rb, cql], ids=["rainbow", "cql"])
def test_the_evaluation_is_the_scripts_own_for_the_same_seed(tmp_path, module):
    """rainbow's and cql's evaluate() (eval mode, --eval-epsilon, one game per env) give the same games."""
    if module is rb:
        args = rb.fill_defaults(rb.preset_args("der", **SMALL, eval_epsilon=0.2, seed=4))
    else:
        args = cql.fill_defaults(cql.agent_args("cql", **SMALL, eval_epsilon=0.2, seed=4, eval_episodes=3))
    path = saved_network(module, args, tmp_path / f"{module.SCRIPT}.pt")
    result = evaluate.main(evaluate.Args(checkpoint=path, episodes=3))
    net = module.build_network(args, 4)
    net.load_state_dict(torch.load(path, weights_only=True)["q_net"])
    if module is rb:
        games = rb.evaluate(net, args, "breakout", 3, "cpu", np.random.default_rng(4))
    else:
        games = cql.evaluate(net, args, "breakout", "cpu", np.random.default_rng(4))
    assert result["episode_returns"] == [r for r, _ in games] and result["episode_lengths"] == [n for _, n in games]
    assert result["policy"] == "epsilon-greedy, epsilon 0.2" and result["protocol"] == args.protocol


def test_dqn_plays_at_dopamines_eval_epsilon_and_the_json_keeps_every_evaluation(tmp_path):
    args = dqn.fill_defaults(dqn.Args(**SMALL, seed=2))
    path = saved_network(dqn, args, tmp_path / "dqn_softmoe.pt")
    first = evaluate.main(evaluate.Args(checkpoint=path, episodes=2))
    again = evaluate.main(evaluate.Args(checkpoint=path, episodes=2))
    other = evaluate.main(evaluate.Args(checkpoint=path, episodes=2, epsilon=1.0, seed=5))
    assert first["policy"] == "epsilon-greedy, epsilon 0.001" and other["policy"] == "epsilon-greedy, epsilon 1"
    assert first["episode_returns"] == again["episode_returns"] and first["seed"] == 2 and other["seed"] == 5
    returns = np.array(first["episode_returns"])
    assert first["mean_return"] == pytest.approx(returns.mean()) and first["std_return"] == pytest.approx(returns.std())
    random, human = atari.RANDOM_HUMAN_SCORES["Breakout"]
    assert first["human_normalized_score"] == pytest.approx((returns.mean() - random) / (human - random))
    with open(tmp_path / "evaluation.json") as f:
        assert [e["seed"] for e in json.load(f)["evaluations"]] == [2, 2, 5]


def test_sarsa_and_tetris_checkpoints_play_softmax_at_their_final_temperature(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kw = dict(env_id="ALE/Breakout-v5", max_episode_frames=200, total_episodes=2, log_every_seconds=1000.0)
    trained = sarsa.main(sarsa.Args(**kw, save_model=True))
    result = evaluate.main(evaluate.Args(checkpoint=trained["checkpoint"], episodes=2))
    tau = sarsa.temperature(2, sarsa.Args().tau0, sarsa.Args().tau_k)
    assert result["policy"] == f"softmax, tau {tau:.4g} (the final temperature)" and result["episodes"] == 2
    assert all(0 < n <= 50 for n in result["episode_lengths"]) and result["dqn_normalized_score"] is not None
    tetris = td.main(td.Args(total_episodes=5, num_runs=2, save_model=True, log_every_seconds=1000.0))
    result = evaluate.main(evaluate.Args(checkpoint=tetris["checkpoint"], episodes=3, run="all", epsilon=0.0))
    assert result["episodes"] == 6 and result["runs"] == [0, 1] and result["policy"] == "epsilon-greedy, 0"
    assert result["mean_return"] == pytest.approx(np.mean(result["episode_returns"]))


def test_a_wrong_missing_or_damaged_checkpoint_is_one_line(tmp_path):
    torch.save({"format": "other/1"}, tmp_path / "other.pt")
    args = dqn.fill_defaults(dqn.Args(**SMALL))
    bad = flip_bytes(saved_network(dqn, args, tmp_path / "dqn_softmoe.pt"), tmp_path / "bad.pt")
    cases = [
        (tmp_path / "missing.pt", "no such file"),
        (tmp_path / "other.pt", "is not a checkpoint of dqn_softmoe"),
        (bad, r"is damaged \(.+ fails its CRC-32 check\)"),
    ]
    for path, message in cases:
        with pytest.raises(SystemExit, match=message):
            evaluate.main(evaluate.Args(checkpoint=str(path)))
    with pytest.raises(SystemExit, match="--episodes must be at least 1"):
        evaluate.main(evaluate.Args(checkpoint=str(bad), episodes=0))
    assert not os.path.exists(tmp_path / "evaluation.json")
