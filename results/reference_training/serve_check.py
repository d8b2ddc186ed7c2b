"""Why the reference's baseline run does not serve: the value each baseline network gives FIRE before the ball is in
play, fresh and trained, in both codes.

In Breakout the ball comes into play only after FIRE; until then no reward and no life is lost. Both codes act
greedily on the NoisyNet from the first step (no epsilon), so a network that ranks FIRE below another action on these
states, by more than its noise moves the ranking, never serves. Two measures, on 100 unserved states (10 games reset
with seeds 0-9, then 10 random NOOP / RIGHT / LEFT steps between stacks, never FIRE; the atari100k protocol):

1. Fresh networks, seeds 0..--seeds-1 of each code (DER's baseline: Nature CNN, no MoE, C51, dueling, NoisyNets):
   the reference's Flax initialisation (`compare_with_dopamine.reference_apply`) copied into our network, against
   ours (`torch.manual_seed(seed)`). Per network: the share of states where FIRE is the greedy action with the noise
   off (the means), and with the noise on (our NoisyLinear's draws, --draws a state). Ours are cheap to build, so
   seeds 0..--ours-seeds-1 also give the action each fresh network of ours prefers over the states (the greatest
   mean Q, noise off): by symmetry each of the 4 actions should come out about a quarter of the time.
2. The trained runs' networks at each 10,000 steps both saved (the reference's checkpoint, our snapshot), and the
   reference's latest checkpoint: the same two shares, and each action's mean Q over the states (noise off).
   The reference run's own initial network is not among them: the agent derives its initialisation key from the
   seed inside its constructor, and no checkpoint of step 0 was kept.

    .refvenv/bin/python -W ignore results/reference_training/serve_check.py --dopamine-dir ../dopamine

Writes serve_check.json beside this file.
"""

import argparse
import json
import os
import pickle
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, ROOT, os.path.join(ROOT, "algos"), os.path.join(ROOT, "benchmark")]
FIRE = 1  # Breakout's minimal action set: NOOP, FIRE, RIGHT, LEFT


def unserved_states(games: int = 10, per_game: int = 10) -> np.ndarray:
    """Stacks before the first serve: reset, then random non-FIRE actions (10 steps between kept stacks)."""
    import rainbow_softmoe as R
    from envs import atari

    args = R.preset_args("der", env_id="ALE/Breakout-v5")
    states = []
    for seed in range(games):
        env = atari.make_env(args.protocol, atari.game_from_env_id(args.env_id), 1, args.max_episode_frames)
        rng = np.random.default_rng(seed)
        obs, _ = env.reset(seed=seed)
        states.append(obs[0])
        for step in range((per_game - 1) * 10):
            obs, *_ = env.step(rng.choice([0, 2, 3], size=1))
            if step % 10 == 9:
                states.append(obs[0])
        env.close()
    return np.stack(states)


def fire_shares(net, states: torch.Tensor, draws: int, generator_seed: int = 0) -> dict:
    """The share of states where FIRE is greedy with the noise off, and over `draws` noisy passes a state."""
    inputs = {"obs": states}
    with torch.no_grad():
        net.eval()
        q = net(inputs)
        net.train()
        torch.manual_seed(generator_seed)
        noisy = [net(inputs).argmax(1) == FIRE for _ in range(draws)]
    net.eval()
    return {
        "fire_greedy_noise_off": float((q.argmax(1) == FIRE).float().mean()),
        "fire_greedy_noise_on": float(torch.stack(noisy).float().mean()),
        "mean_q_per_action": [float(v) for v in q.mean(0)],
        "preferred_action": int(q.mean(0).argmax()),  # the greatest mean Q over the states, noise off
        "greedy_action_counts_noise_off": [int((q.argmax(1) == a).sum()) for a in range(q.shape[1])],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dopamine-dir", required=True)
    p.add_argument("--seeds", type=int, default=20, help="fresh networks per code (the reference: ~25 s each)")
    p.add_argument("--draws", type=int, default=10, help="noisy passes a state")
    p.add_argument("--ours-seeds", type=int, default=500, help="fresh networks of ours for the preferred action")
    cli = p.parse_args()
    import jax
    from compare import our_snapshot, reference_checkpoint, reference_latest_step

    import compare_with_dopamine as cw
    import rainbow_softmoe as R

    torch.set_num_threads(1)
    networks, _ = cw.import_reference(cli.dopamine_dir)
    cfg = cw.configurations()[1]  # DER baseline: Rainbow, Nature CNN, no MoE
    assert cfg["moe"] == "none"
    states = unserved_states()
    x = torch.from_numpy(states)
    result = {"states": len(states), "draws_per_state": cli.draws, "fresh": {"dopamine": [], "ours": []}}
    for seed in range(cli.seeds):
        flat, *_ = cw.reference_apply(networks, cfg, 4, jax.random.PRNGKey(seed), states[:1].transpose(0, 2, 3, 1))
        result["fresh"]["dopamine"].append(fire_shares(cw.loaded_network(flat, cfg, 4), x, cli.draws))
        torch.manual_seed(seed)
        result["fresh"]["ours"].append(fire_shares(cw.our_network(cfg, 4), x, cli.draws))
    for code in ("dopamine", "ours"):
        rows = result["fresh"][code]
        off = np.array([r["fire_greedy_noise_off"] for r in rows])
        on = np.array([r["fire_greedy_noise_on"] for r in rows])
        result["fresh"][f"{code}_summary"] = {
            "networks": len(rows),
            "never_fire_noise_off": int((off == 0).sum()),
            "never_fire_noise_on": int((on == 0).sum()),
            "below_1_percent_noise_on": int((on < 0.01).sum()),
            "mean_fire_share_noise_on": float(on.mean()),
            "noise_changes_fire_share": int((off != on).sum()),
            "prefer_fire": sum(r["preferred_action"] == FIRE for r in rows),
        }
        print(f"fresh {code}: {result['fresh'][f'{code}_summary']}")
    preferred = []
    for seed in range(cli.ours_seeds):
        torch.manual_seed(seed)
        net = cw.our_network(cfg, 4).eval()
        with torch.no_grad():
            preferred.append(int(net({"obs": x}).mean(0).argmax()))
    counts = {"seeds": cli.ours_seeds, "NOOP FIRE RIGHT LEFT": np.bincount(preferred, minlength=4).tolist()}
    result["fresh"]["ours_preferred_action_counts"] = counts | {"per_seed": preferred}
    print(
        f"fresh ours, {cli.ours_seeds} seeds, preferred action NOOP FIRE RIGHT LEFT: {counts['NOOP FIRE RIGHT LEFT']}"
    )
    reference_dir = os.path.join(HERE, "work", "dopamine_Breakout_baseline_s1")
    latest = reference_latest_step(reference_dir, 2_000)
    if latest is None:
        raise SystemExit(f"error: the reference run in {reference_dir} has no checkpoint yet")
    result["trained"] = {}
    for step in sorted({*range(10_000, latest + 1, 10_000), latest}):
        row = {}
        if path := reference_checkpoint(reference_dir, step, 2_000):
            with open(path, "rb") as f:
                ckpt = pickle.load(f)
            row["dopamine"] = fire_shares(cw.loaded_network(cw.flatten(ckpt["online_params"]), cfg, 4), x, cli.draws)
        if path := our_snapshot("none", step):
            snapshot = torch.load(path, weights_only=True)
            net = R.build_network(R.fill_defaults(R.Args(**snapshot["args"])), 4)
            net.load_state_dict(snapshot["q_net"])
            row["ours"] = fire_shares(net, x, cli.draws)
        result["trained"][str(step)] = row
        print(f"trained at {step}: {json.dumps(row)}")
    with open(os.path.join(HERE, "serve_check.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
