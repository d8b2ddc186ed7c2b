"""Fig. 10's network statistics (Obando-Ceron et al. 2024, §4.3; the reference's metrics: dopamine/labs/moes/agents and
dopamine/labs/redo/weight_recyclers.py for dormant neurons) from the snapshots a training run writes with --snapshot-
every (by default every 250k agent steps).

    python benchmark/moe_analysis.py runs/<run>                      # every snapshot of the run
    python benchmark/moe_analysis.py runs/<run>/snapshots/dqn_softmoe_250000.pt --ntk-memory-mb 2048

For each snapshot it prints the statistics and, for a run directory, writes them to runs/<run>/analysis.csv (one row
per snapshot) and to the run's tensorboard as analysis/<name>, where the training curves are. A snapshot holds the
online and target networks, the run's arguments, 32 transitions sampled from the replay memory at that step (by a
generator seeded by the step) and torch's generator state, so the numbers are those the training run would have
measured at that step. The snapshot names its script (algos/<script>.py), which is imported for its network
(`build_network`) and its training loss (`<algo>_loss(q_net, target_net, batch, args)`, which returns the loss and
metrics with `per_sample_loss` and the network's activations `aux`), so the analysis works for every script that
writes snapshots in this format.
"""

import argparse
import csv
import dataclasses
import glob
import importlib
import math
import os
import re
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "algos"), ROOT]
from envs import exit_if_damaged  # noqa: E402


def dormant_fraction(hidden: torch.Tensor, tau: float = 0.0) -> float:
    """Sokar et al. (2023): unit i is tau-dormant if s_i = E|h_i| / mean_k E|h_k| <= tau. hidden (B, ..., H): the
    expectation is over the batch and, as the reference's MoE agent does, the middle axes (experts, slots) too, so
    unit i of every expert is one unit. tau = 0 is the reference code's threshold (there sum- and mean-normalised
    scores agree)."""
    score = hidden.abs().mean(dim=tuple(range(hidden.dim() - 1)))  # (H,)
    score = score / (score.mean() + 1e-9)
    return float((score <= tau).float().mean())


def feature_norm(hidden: torch.Tensor) -> float:
    """The reference's Rainbow statistic: per-feature variance across the batch, l2 norm over the feature axis,
    averaged over any leading axes. hidden (B, ..., H)."""
    return float(hidden.var(0, unbiased=False).norm(dim=-1).mean())


def srank(features: torch.Tensor, delta: float = 0.01) -> int:
    """Kumar et al. (2021): min k with sum_{i<=k} sigma_i / sum_i sigma_i >= 1 - delta, sigma the singular values of
    the (batch x features) matrix."""
    sigma = torch.linalg.svdvals(features.double())
    cumulative = sigma.cumsum(0) / sigma.sum().clamp_min(1e-12)
    return int((cumulative < 1 - delta).sum()) + 1


def threshold_rank(matrix: torch.Tensor, t: float = 0.01) -> int:
    """The reference code's rank proxy: #{i : sigma_i / sigma_max > t}."""
    sigma = torch.linalg.svdvals(matrix.double())
    return int((sigma / sigma[0].clamp_min(1e-12) > t).sum())


def routing_statistics(aux: dict) -> dict[str, float]:
    """How much Soft MoE routes, on one batch. Entropy of each slot's dispatch weights over the m tokens / log m, and
    of each token's combine weights over the n p slots / log(n p): at 1 every slot is the mean of all tokens and every
    output token is the same vector, so the layer is global average pooling followed by the experts (where it starts:
    Phi's lecun_normal logits are ~0.01 on the Nature CNN's tokens). Token diversity: the variance of the tokens across
    positions over their mean squared norm (0: every position carries the same vector), of the encoder's tokens (in)
    and of the layer's output tokens (out, the Q head's input)."""
    aux = {k: v.detach() for k, v in aux.items() if torch.is_tensor(v)}  # statistics, no graph
    dispatch, combine = aux["dispatch"], aux["combine"]
    B, m, n, p = dispatch.shape

    def entropy(probs: torch.Tensor, dim: int) -> torch.Tensor:
        return -(probs * probs.clamp_min(1e-30).log()).sum(dim)

    def diversity(tokens: torch.Tensor) -> float:  # (B, m, d)
        spread = tokens.var(1, unbiased=False).sum(-1) / tokens.pow(2).sum(-1).mean(1).clamp_min(1e-30)
        return float(spread.mean())

    out = {
        "token_diversity_in": diversity(aux["tokens"]),
        "token_diversity_out": diversity(aux["head_input"].view(B, m, -1)),
    }
    if m > 1:
        out["routing_dispatch_entropy"] = float(entropy(dispatch, 1).mean() / math.log(m))
    if n * p > 1:
        out["routing_combine_entropy"] = float(entropy(combine.reshape(B, m, n * p), -1).mean() / math.log(n * p))
    return out


def empirical_ntk(per_sample_loss, params: list, batch_size: int, memory_bytes: int = 2**29) -> torch.Tensor:
    """K_ij = <grad l_i, grad l_j> over all parameters, l_i = per_sample_loss(i) the training loss of sample i alone
    (B x B). One forward/backward per sample; when B x #params floats exceed `memory_bytes`, the parameter vector is
    covered in several passes."""
    total = sum(p.numel() for p in params)
    chunk = max(1, min(total, memory_bytes // (4 * batch_size)))
    K = torch.zeros(batch_size, batch_size, dtype=torch.float64)
    for start in range(0, total, chunk):
        rows = torch.empty(batch_size, min(chunk, total - start))
        for i in range(batch_size):
            grads = torch.autograd.grad(per_sample_loss(i), params, allow_unused=True)
            grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params, strict=True)]
            rows[i] = torch.cat([g.flatten() for g in grads])[start : start + rows.shape[1]].cpu()
        K += (rows @ rows.T).double()
    return K


def network_analysis(q_net, target_net, batch: dict, args, loss_fn, ntk_memory_bytes: int = 2**29) -> dict:
    """Fig. 10 statistics on one batch, each named for what it measures: dormant neurons of the penultimate hidden
    units (the experts' hidden layer for MoEs, as the reference's DQN agent); feature norm and srank of the Q head's
    input (the flattened MoE output, what the reference's Rainbow agent measures) and of the experts' hidden layer; the
    rank of the empirical NTK of the per-sample training loss; for MoEs the expert load (combine mass per expert for
    Soft MoE, routed-token share for Top1), Top1's dropped tokens and Soft MoE's routing entropies and token diversity
    (`routing_statistics`). loss_fn(q_net, target_net, batch, args) -> (loss, metrics with per_sample_loss and aux)."""
    with torch.no_grad():
        _, metrics = loss_fn(q_net, target_net, batch, args)
    aux = metrics["aux"]
    head_input, hidden = aux["head_input"], aux["hidden"]
    out = {
        "dormant_percentage": 100.0 * dormant_fraction(hidden, 0.0),
        "feature_norm_head_input": feature_norm(head_input),
        "srank_head_input": srank(head_input, 0.01),
        "srank_threshold_0.01_head_input": threshold_rank(head_input, 0.01),
        "td_loss": float(metrics["td_loss"]),
        "q_mean": float(metrics["q_values"]),
    }
    if "combine" in aux or "router_probs" in aux:
        out["feature_norm_expert_hidden"] = feature_norm(hidden.flatten(1, -2))
        out["srank_expert_hidden"] = srank(hidden.reshape(len(hidden), -1), 0.01)
        out["srank_threshold_0.01_expert_hidden"] = threshold_rank(hidden.reshape(len(hidden), -1), 0.01)

    def per_sample_loss(i):
        return loss_fn(q_net, target_net, rows(batch, i), args)[1]["per_sample_loss"][0]

    params = [p for p in q_net.parameters() if p.requires_grad]
    K = empirical_ntk(per_sample_loss, params, len(batch["actions"]), ntk_memory_bytes)
    out["entk_srank_0.01"] = threshold_rank(K, 0.01)
    out["entk_srank_kumar"] = srank(K, 0.01)
    out["entk_diag_mean"] = float(K.diagonal().mean())
    if "combine" in aux:
        per_token = aux["combine"].sum(-1)  # (B, m, n): combine mass of each expert for each token
        load = per_token.mean((0, 1))  # share of the combine mass per expert (sums to 1)
        top = per_token.argmax(-1)  # the reference's logged "top_experts"
        out.update(routing_statistics(aux))
    elif "router_probs" in aux:
        top = aux["expert"]
        load = F.one_hot(top, aux["router_probs"].shape[-1]).float().mean((0, 1))  # share of the routed tokens
        out["dropped_token_fraction"] = float(1.0 - aux["kept"].float().mean())
    else:
        return out
    top_share = F.one_hot(top, len(load)).float().mean((0, 1))
    out.update({f"expert_load_{e}": float(v) for e, v in enumerate(load)})
    out.update({f"expert_top_token_share_{e}": float(v) for e, v in enumerate(top_share)})
    out["expert_load_max"] = float(load.max())
    return out


def analyse_snapshot(path: str, ntk_memory_mb: int = 512, device: str = "cpu") -> dict:
    """The statistics of one snapshot, measured as the training run would have measured them at its step: the
    networks as the run built them (channels_last), the probe transitions, torch's generator state of that moment."""
    snap = torch.load(path, map_location="cpu", weights_only=True)
    script = importlib.import_module(snap["script"])
    fields = {f.name for f in dataclasses.fields(script.Args)}
    args = script.Args(**{k: v for k, v in snap["args"].items() if k in fields})
    args.device, args.cuda_graph = device, False
    nets = []
    for key in ("q_net", "target_net"):
        net = script.build_network(args, snap["num_actions"]).to(device, memory_format=torch.channels_last)
        net.load_state_dict(snap[key])
        nets.append(net.eval())  # the statistics of the mean network (NoisyNets' noise off)
    nets[1].requires_grad_(False)
    probe = snap["probe"]
    for key in ("states", "next_states"):  # a snapshot written before the network took a mapping of its inputs
        if torch.is_tensor(probe[key]):
            probe[key] = {"obs": probe[key]}
    batch = to_device(probe, device)
    if "weights" in batch:  # prioritised replay's importance weights: the plain per-sample loss is measured
        batch["weights"] = torch.ones_like(batch["weights"])
    loss_fn = getattr(script, f"{snap['script'].removesuffix('_softmoe')}_loss")
    torch.set_rng_state(snap["torch_rng"])  # a random Phi and Top1's load-loss noise draw what the run would have
    out = network_analysis(nets[0], nets[1], batch, args, loss_fn, ntk_memory_mb * 2**20)
    return {"global_step": snap["global_step"]} | out


def to_device(batch: dict, device) -> dict:
    return {k: to_device(v, device) if isinstance(v, dict) else v.to(device) for k, v in batch.items()}


def rows(batch: dict, i: int) -> dict:
    """Sample i of a batch (its input mappings included) as a batch of one."""
    return {k: rows(v, i) if isinstance(v, dict) else v[i : i + 1] for k, v in batch.items()}


def check_snapshot(path: str):
    """One line for a file that is not a readable snapshot of the training scripts (before any long work)."""
    exit_if_damaged(path)
    try:
        snap = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  (missing, truncated, or any unpickling failure)
        raise SystemExit(f"error: {path!r} is not a readable snapshot ({type(err).__name__})") from None
    if not isinstance(snap, dict) or not {"script", "args", "probe", "q_net", "global_step"} <= set(snap):
        raise SystemExit(f"error: {path!r} is not a snapshot (a checkpoint? snapshots are runs/<run>/snapshots/*.pt)")


def write_csv(path: str, rows: list[dict]):
    names = sorted({k for row in rows for k in row} - {"global_step"})
    with open(f"{path}.tmp", "w", newline="") as f:
        out = csv.DictWriter(f, ["global_step", *names])
        out.writeheader()
        out.writerows(rows)
    os.replace(f"{path}.tmp", path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="a run directory (all its snapshots/*.pt) or one snapshot file")
    parser.add_argument("--ntk-memory-mb", type=int, default=512, help="memory for the NTK's per-sample gradients")
    parser.add_argument("--device", default="cpu")
    cli = parser.parse_args()
    if cli.ntk_memory_mb < 1:
        raise SystemExit(f"error: --ntk-memory-mb must be at least 1, got {cli.ntk_memory_mb}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    is_run = os.path.isdir(cli.path)
    paths = glob.glob(os.path.join(cli.path, "snapshots", "*.pt")) if is_run else [cli.path]
    if odd := [p for p in paths if is_run and not re.fullmatch(r".+_\d+\.pt", os.path.basename(p))]:
        raise SystemExit(f"error: {odd[0]!r} is not named <script>_<step>.pt as the scripts name snapshots")
    paths = sorted(paths, key=lambda p: int(p.rsplit("_", 1)[-1].removesuffix(".pt"))) if is_run else paths
    if not paths:
        raise SystemExit(f"error: no snapshots in {cli.path!r} (train with --snapshot-every N)")
    for path in paths:  # every file checked before the first (long) analysis
        check_snapshot(path)
    rows, table = [], os.path.join(cli.path, "analysis.csv")
    for path in paths:
        rows.append(analyse_snapshot(path, cli.ntk_memory_mb, cli.device))
        print(os.path.basename(path), " ".join(f"{k}={v:.4g}" for k, v in rows[-1].items() if k != "global_step"))
        if is_run:  # after every snapshot, so a stop keeps what is done; analysis.csv only once all are
            write_csv(f"{table}.partial", rows)
    if is_run:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(cli.path, filename_suffix=".moe_analysis")
        for row in rows:
            for k, v in row.items():
                if k != "global_step":
                    writer.add_scalar(f"analysis/{k}", v, row["global_step"])
        writer.close()
        os.replace(f"{table}.partial", table)  # complete: what queue.sh and the report take as up to date
        print(f"wrote {table} and the tensorboard scalars analysis/*")


if __name__ == "__main__":
    main()
