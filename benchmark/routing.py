"""How much the Soft MoE runs of the queue route: the routing statistics of `moe_analysis.routing_statistics` on
256 states from each run's own replay memory, for its latest checkpoint and for a freshly initialised network of the
same architecture (seed 0), plus the spread of Q over the actions and the norm of the encoder's output tokens (the
11 x 11 positions' 64-vectors). The baseline runs get the last two, for comparison. For runs with noisy experts (DER,
full Rainbow) it also measures how often the greedy action stays the same when the experts' NoisyNet noise is left on:
the reference's eval mode does that (its ExpertModel never receives eval_mode); our evaluation turns all noise off.

    .venv/bin/python benchmark/routing.py      # every run with a checkpoint in results/atari100k_cpu/work/runs
    .venv/bin/python benchmark/routing.py --out results/atari100k_cpu/routing.json  # updates its entries

Needs the checkpoints saved with --checkpoint-replay (the queue does). Reads only; one torch thread.
"""

import argparse
import glob
import json
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, os.path.join(ROOT, "algos"))
import rainbow_softmoe as rb  # noqa: E402
from envs import exit_if_damaged  # noqa: E402  (the script put the repository root on sys.path)
from moe_analysis import routing_statistics  # noqa: E402  (beside this file)


def statistics(net, inputs: dict) -> dict:
    with torch.no_grad():
        q, aux = net(inputs, return_aux=True)
        tokens = rb.tokenize(net.encoder(inputs["obs"].float() / 255.0), "perconv")  # (B, h*w, d), whatever the network
    out = routing_statistics(aux) if "dispatch" in aux else {}
    out["q_mean"] = float(q.mean())
    out["q_spread_over_actions"] = float(q.std(1).mean())
    out["token_norm_in"] = float(tokens.norm(dim=-1).mean())
    if "dispatch" in aux:
        out["phi_norm"] = float(net.moe.phi.detach().norm()) if net.moe.phi is not None else None
        if hasattr(net.moe.experts, "w1_sigma"):
            out["same_greedy_action_with_expert_noise"] = expert_noise_agreement(net, inputs, q.argmax(1))
    return out


def expert_noise_agreement(net, inputs: dict, greedy: torch.Tensor, draws: int = 10) -> float:
    """Fraction of states whose greedy action (all noise off) is unchanged with only the experts' noise on, mean over
    `draws` noise draws (torch's generator, seed 0)."""
    torch.manual_seed(0)
    net.moe.experts.train()  # the experts alone in train mode: their noise on, every other layer's off
    with torch.no_grad():
        same = [float((net(inputs).argmax(1) == greedy).float().mean()) for _ in range(draws)]
    net.moe.experts.eval()
    return float(np.mean(same))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=os.path.join(ROOT, "results", "atari100k_cpu", "work", "runs"), help="runs/")
    parser.add_argument("--states", type=int, default=256)
    parser.add_argument("--out", default=None)
    cli = parser.parse_args()
    torch.set_num_threads(1)
    latest = {}  # run name -> newest segment's checkpoint
    for path in sorted(glob.glob(os.path.join(cli.runs, "*", "rainbow_softmoe.pt")), key=os.path.getmtime):
        name = os.path.basename(os.path.dirname(path)).split("__")[1]
        latest[name] = path
    report = {}
    for name, path in latest.items():
        exit_if_damaged(path)
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        known = {k: v for k, v in ckpt["args"].items() if k in rb.Args.__dataclass_fields__}  # older flags dropped
        args = rb.fill_defaults(rb.Args(**known))
        if args.moe not in ("softmoe", "none") or not ckpt.get("replay"):
            continue
        replay = rb.FrameReplay(args.buffer_size, args.num_envs, prioritized=False)
        saved = rb.load_replay(path, ckpt["replay"])
        for key in ("priorities", "max_priority"):  # read as a uniform replay: the states are all it needs
            saved.pop(key, None)
        replay.load_state_dict(saved)
        batch = replay.sample(cli.states, np.random.default_rng(0), args.n_step, args.gamma)
        inputs = rb.to_tensors(batch["states"], "cpu")
        head_bias = ckpt["q_net"].get("advantage.bias", ckpt["q_net"].get("advantage.bias_mu"))  # plain | noisy
        num_actions = len(head_bias) // args.num_atoms
        trained = rb.build_network(args, num_actions)
        trained.load_state_dict(ckpt["q_net"])
        torch.manual_seed(0)
        fresh = rb.build_network(args, num_actions)
        for net in (trained, fresh):
            net.eval()  # the noise off
        report[name] = {
            "checkpoint": os.path.relpath(path, ROOT),
            "global_step": ckpt["global_step"],
            "trained": statistics(trained, inputs),
            "initialised": statistics(fresh, inputs),
        }
        t, i = report[name]["trained"], report[name]["initialised"]
        line = (
            f"{name} at step {ckpt['global_step']:,}: token norm {t['token_norm_in']:.3f} "
            f"(init {i['token_norm_in']:.3f}), Q spread over actions {t['q_spread_over_actions']:.4f} "
            f"(init {i['q_spread_over_actions']:.4f})"
        )
        if args.moe == "softmoe":
            line += (
                f", dispatch entropy / log m {t['routing_dispatch_entropy']:.5f} "
                f"(init {i['routing_dispatch_entropy']:.5f}), combine {t['routing_combine_entropy']:.5f} "
                f"(init {i['routing_combine_entropy']:.5f}), token diversity out/in {t['token_diversity_out']:.2e} / "
                f"{t['token_diversity_in']:.3f} (init {i['token_diversity_out']:.2e} / {i['token_diversity_in']:.3f}), "
                f"|Phi| {t['phi_norm']:.3f} (init {i['phi_norm']:.3f})"
            )
            key = "same_greedy_action_with_expert_noise"
            if key in t:
                line += f", greedy action unchanged with the experts' noise on {t[key]:.1%} (init {i[key]:.1%})"
        print(line)
    if cli.out:  # merge: a run measured earlier keeps its entry once its checkpoint is gone (a fresh checkout)
        if os.path.exists(cli.out):
            with open(cli.out) as f:
                report = json.load(f) | report
        with open(cli.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
