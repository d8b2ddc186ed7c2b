"""Why one DQN update with Soft MoE differs from the reference's by more than float32 rounding of the weights
(benchmark/compare_with_dopamine.py part 3: up to 0.7% of the learning rate, in the encoder): both gradients against
the same maths in float64.

Same setup as that script's part 3 (DQN, Nature CNN, Soft MoE with 4 experts, the reference's parameters, the same
batch). The reference's gradient is read back from its first Adam step (step = -lr g / (|g| + eps)), on the elements
where |g| < eps / 10, where that inversion is well conditioned. The routing is near uniform, so the gradient that
reaches the encoder through the two softmaxes is a small difference of nearly equal terms, and float32 rounding
shows there first.

    .refvenv/bin/python -W ignore results/reference_check/dqn_gradient_precision.py --dopamine-dir ../dopamine
"""

import argparse
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, os.path.join(ROOT, "benchmark"))
import compare_with_dopamine as check  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dopamine-dir", required=True, help="a checkout of github.com/google/dopamine")
    cli = parser.parse_args()
    networks, agents = check.import_reference(cli.dopamine_dir)
    torch.set_num_threads(1)
    A = 18
    states = np.concatenate([check.atari_states("Boxing", 16, 0), check.atari_states("Breakout", 16, 0)])
    batch = check.update_batch(states, A)
    args, cfg = check.update_setup("DQN, Nature CNN, Soft MoE 4 experts", "dqn", "dqn", "softmoe")
    online, target, new_params, _, _ = check.reference_update(networks, agents, cfg, args, batch, A)
    lr, eps = args.learning_rate, args.adam_eps
    before = check.loaded_network(check.flatten(online), cfg, A).state_dict()
    after = check.loaded_network(check.flatten(new_params), cfg, A).state_dict()
    tensors = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}
    tensors["actions"] = tensors["actions"].long()

    # ours in float32, as the script trains
    q32 = check.loaded_network(check.flatten(online), cfg, A)
    inputs = {"states": {"obs": tensors["states"]}, "next_states": {"obs": tensors["next_states"]}}
    loss, _ = check.dqn_softmoe.dqn_loss(
        q32, check.loaded_network(check.flatten(target), cfg, A), tensors | inputs, args
    )
    loss.backward()

    # the same maths in float64: encoder -> PerConv tokens -> Soft MoE -> head, y = r + gamma (1 - done) max Q_target
    def q_values(net, s):
        outputs, _ = net.moe(check.dqn_softmoe.tokenize(net.encoder(s.double() / 255.0), "perconv"))
        return net.head(outputs.flatten(1))

    q64, t64 = (check.loaded_network(check.flatten(p), cfg, A).double() for p in (online, target))
    with torch.no_grad():
        next_q = q_values(t64, tensors["next_states"]).max(1).values
        y = tensors["rewards"].double() + args.gamma * (1 - tensors["terminals"].double()) * next_q
    q_taken = q_values(q64, tensors["states"]).gather(1, tensors["actions"][:, None]).squeeze(1)
    ((y - q_taken) ** 2).mean().backward()

    print(f"{'tensor':<24} {'max|g|':>10} {'small |g|':>10} {'max|ours f32 - f64|':>20} {'max|reference - f64|':>21}")
    grads32, grads64 = dict(q32.named_parameters()), dict(q64.named_parameters())
    for name, p64 in grads64.items():
        if p64.grad is None:
            continue
        g64, g32 = p64.grad, grads32[name].grad.double()
        step_ref = (after[name] - before[name]).double()
        g_ref = -step_ref * eps / (lr - step_ref.abs())
        small = g64.abs() < eps / 10
        if small.any():
            print(
                f"{name:<24} {float(g64.abs().max()):>10.2e} {float(small.double().mean()):>10.0%} "
                f"{float((g32 - g64)[small].abs().max()):>20.2e} {float((g_ref - g64)[small].abs().max()):>21.2e}"
            )


if __name__ == "__main__":
    main()
