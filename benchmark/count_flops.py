"""Floating-point operations of one update (batch 32, forward + backward) and one acting pass (one state) of
dqn_softmoe.py and rainbow_softmoe.py on the Nature CNN, counted by torch.utils.flop_counter (matrix products and
convolutions only): python benchmark/count_flops.py"""

import os
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "algos"))
import dqn_softmoe  # noqa: E402
import rainbow_softmoe  # noqa: E402


def count(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def flops_of(module, loss_name: str, moe: str, batch_size: int, num_actions: int) -> tuple[int, int]:
    """(one update of batch_size, one acting pass on one state) of `module`'s loss on the Nature CNN."""
    argv = ["--env-id", "ALE/Breakout-v5", "--encoder", "nature", "--moe", moe]
    parse = getattr(module, "parse_args", None) or (lambda a: module.tyro.cli(module.Args, args=a))
    args = module.fill_defaults(parse(argv))
    q_net, target_net = module.build_network(args, num_actions), module.build_network(args, num_actions)
    batch = {
        "states": {"obs": torch.rand(batch_size, 4, 84, 84)},
        "next_states": {"obs": torch.rand(batch_size, 4, 84, 84)},
        "actions": torch.randint(0, num_actions, (batch_size,)),
        "rewards": torch.rand(batch_size),
        "terminals": torch.zeros(batch_size),
        "weights": torch.ones(batch_size),
    }

    def update():
        loss, _ = getattr(module, loss_name)(q_net, target_net, batch, args)
        loss.backward()

    def act():
        with torch.no_grad():
            q_net({"obs": torch.rand(1, 4, 84, 84)})

    return count(update), count(act)


def main(batch_size: int = 32, num_actions: int = 4):  # Breakout's 4 actions, as in the README's speed table
    torch.manual_seed(0)
    rows = []
    for module, loss_name in ((dqn_softmoe, "dqn_loss"), (rainbow_softmoe, "rainbow_loss")):
        script = module.__name__
        for moe in ("none", "softmoe"):
            rows.append((script, moe, *flops_of(module, loss_name, moe, batch_size, num_actions)))
    print("| script | --moe | one update, batch 32 (GFLOP) | one acting pass (MFLOP) |")
    print("|---|---|---|---|")
    for script, moe, update_flops, act_flops in rows:
        print(f"| {script} | {moe} | {update_flops / 1e9:.2f} | {act_flops / 1e6:.1f} |")
    dqn = {moe: update_flops for script, moe, update_flops, _ in rows if script == "dqn_softmoe"}
    for script, moe, update_flops, _ in rows:
        if script == "rainbow_softmoe":
            print(f"--moe {moe}: DQN's update FLOPs / Rainbow's = {dqn[moe] / update_flops:.2f}")


if __name__ == "__main__":
    main()
