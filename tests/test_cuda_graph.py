"""--cuda-graph (dqn_softmoe.py, rainbow_softmoe.py): the replayed graph makes the same updates and picks the same
actions as eager mode. Everything but the CPU error needs a GPU and is skipped without one."""

import numpy as np
import pytest
import torch

import dqn_softmoe as dqn
import rainbow_softmoe as rb

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
NETWORKS = [dict(encoder="nature", moe="none"), dict(encoder="nature", moe="softmoe", num_experts=2, expert_width=32)]


def filled_replay(module, args, rows=600, seed=0):
    rng = np.random.default_rng(seed)
    kw = {"prioritized": not args.uniform_replay} if module is rb else {}
    replay = module.FrameReplay(rows, 1, **kw)
    for t in range(rows):
        frame = rng.integers(0, 256, (1, 84, 84), dtype=np.uint8)
        replay.add(frames=frame, actions=np.array([t % 4]), rewards=np.array([float(t % 7 == 0)]),
                   terminals=np.array([t % 90 == 89]), valid=np.ones(1, bool),
                   history=np.array([min(t % 90, 3)]))  # fmt: skip
    return replay


def twin_learners(module, args):
    """Two identical online/target pairs with their Adam optimisers (capturable, as --cuda-graph makes them)."""
    torch.manual_seed(0)
    nets = module.build_network(args, 4).cuda()
    learners = []
    for _ in range(2):
        q_net, target_net = module.build_network(args, 4).cuda(), module.build_network(args, 4).cuda()
        q_net.load_state_dict(nets.state_dict())
        target_net.load_state_dict(nets.state_dict())
        optimizer = torch.optim.Adam(q_net.parameters(), lr=1e-3, eps=args.adam_eps, fused=True, capturable=True)
        learners.append((q_net, target_net, optimizer))
    return learners


@needs_cuda
@pytest.mark.parametrize("module", [dqn, rb], ids=["dqn", "rainbow"])
@pytest.mark.parametrize("network", NETWORKS, ids=["none", "softmoe"])
def test_the_replayed_update_makes_the_eager_updates(module, network):
    """Three updates on three batches: the same parameters (noise off, no augmentation: nothing random), so the graph
    neither accumulates gradients nor keeps the warm-up's steps."""
    args = module.Args(**network, device="cuda")
    if module is rb:
        args.noisy = False
    args = module.fill_defaults(args)
    replay, rng = filled_replay(module, args), np.random.default_rng(1)
    batches = [replay.sample(32, rng, args.n_step, args.gamma) for _ in range(3)]
    (q_eager, t_eager, opt_eager), (q_graph, t_graph, opt_graph) = twin_learners(module, args)
    # the loop's one update path: train_step, eagerly or recorded at the first call and replayed
    update = module.GraphedUpdate(module.observation_step, q_graph, t_graph, opt_graph, args)
    for batch in batches:
        eager_metrics = module.train_step(q_eager, t_eager, opt_eager, module.to_tensors(batch, "cuda"), args)
        graph_metrics = update(module.observation_batch(batch))
        torch.testing.assert_close(graph_metrics["td_loss"], eager_metrics["td_loss"], rtol=1e-4, atol=1e-6)
    for (name, a), b in zip(q_eager.state_dict().items(), q_graph.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=name)


@needs_cuda
@pytest.mark.parametrize("module", [dqn, rb], ids=["dqn", "rainbow"])
def test_the_replayed_policy_picks_the_eager_greedy_actions(module):
    args = module.fill_defaults(module.Args(encoder="nature", moe="none", device="cuda"))
    torch.manual_seed(0)
    q_net = module.build_network(args, 6).cuda()
    q_net.eval()  # NoisyNets draw other noise in the graph than eagerly: their means
    policy = module.GraphedPolicy(module.ObservationOnly(q_net), num_envs=3)
    obs = np.random.default_rng(0).integers(0, 256, (3, 4, 84, 84), dtype=np.uint8)
    with torch.no_grad():
        eager = q_net({"obs": torch.from_numpy(obs).cuda()}).argmax(1).cpu().numpy()
    np.testing.assert_array_equal(policy(obs), eager)


@needs_cuda
@pytest.mark.parametrize(
    "module, kw",
    [
        (dqn, dict(encoder="nature", num_experts=2, expert_width=32)),
        (rb, dict(preset="full-rainbow", encoder="nature", num_experts=2, expert_width=32)),
        (rb, dict(preset="drq-eps", encoder="nature", moe="none")),  # augmentation, target period 1
    ],
    ids=["dqn", "rainbow", "drq-eps"],
)
def test_a_run_with_cuda_graphs_learns_and_writes_its_checkpoint(tmp_path, monkeypatch, module, kw):
    monkeypatch.chdir(tmp_path)
    # eval_episodes 0: drq-eps evaluates 100 episodes by default, which an untrained Breakout agent may never end
    kw = dict(kw, env_id="ALE/Breakout-v5", total_timesteps=400, learning_starts=200, buffer_size=3000,
              log_every_seconds=1000.0, cuda_graph=True, device="cuda", save_model=True)  # fmt: skip
    if module is rb:
        summary = rb.main(rb.preset_args(kw.pop("preset"), snapshot_every=0, eval_episodes=0, **kw))
    else:
        summary = dqn.main(dqn.Args(snapshot_every=0, **kw))
    assert summary["complete"] and summary["updates"] > 0
    saved = torch.load(summary["checkpoint"], weights_only=True)
    assert all(torch.isfinite(v).all() for v in saved["q_net"].values())


@needs_cuda
def test_a_resume_on_cuda_goes_on_with_the_cuda_generator_and_may_add_cuda_graphs(tmp_path, monkeypatch):
    """The CUDA generator (NoisyNets' noise is drawn there) is checkpointed: a run stopped at 250 and resumed to 300
    ends with the generator of the uninterrupted run. A resume may add --cuda-graph (Adam's capturable follows it)."""
    monkeypatch.chdir(tmp_path)
    kw = dict(env_id="ALE/Breakout-v5", learning_starts=200, buffer_size=3000, log_every_seconds=1000.0, device="cuda",
              save_model=True, checkpoint_replay=True, snapshot_every=0, encoder="nature", moe="none")  # fmt: skip
    whole = rb.main(rb.preset_args("full-rainbow", total_timesteps=300, **kw))
    first = rb.main(rb.preset_args("full-rainbow", total_timesteps=250, **kw))
    resumed = rb.main(rb.preset_args("full-rainbow", total_timesteps=300, resume=first["checkpoint"], **kw))
    a, b, stop = (torch.load(s["checkpoint"], weights_only=True)["cuda_rng"] for s in (whole, resumed, first))
    assert torch.equal(a, b) and not torch.equal(a, stop)
    graphed = rb.main(rb.preset_args("full-rainbow", total_timesteps=300, resume=first["checkpoint"], cuda_graph=True,
                                     **kw))  # fmt: skip
    assert graphed["complete"] and graphed["updates"] > first["updates"]


@pytest.mark.parametrize("module", [dqn, rb], ids=["dqn", "rainbow"])
def test_the_graphed_paths_observation_only_adapters_compute_the_eager_update_and_q_values(module):
    """On a CPU: what --cuda-graph records (observation_step on an observation_batch, the network behind
    ObservationOnly) is train_step on the sampled batch and the network on its inputs mapping, float for float."""
    args = module.fill_defaults(module.Args(encoder="nature", moe="softmoe", num_experts=2, expert_width=32))
    if module is rb:
        args.noisy = False
    torch.manual_seed(0)
    nets = [module.build_network(args, 4) for _ in range(3)]
    nets[1].load_state_dict(nets[0].state_dict())
    optimizers = [module.make_optimizer(net, args) for net in nets[:2]]
    batch = filled_replay(module, args).sample(16, np.random.default_rng(1), args.n_step, args.gamma)
    flat = module.observation_batch(batch)
    assert flat["states"] is batch["states"]["obs"] and flat["next_states"] is batch["next_states"]["obs"]
    eager = module.train_step(nets[0], nets[2], optimizers[0], module.to_tensors(batch, "cpu"), args)
    graphed = module.observation_step(nets[1], nets[2], optimizers[1], module.to_tensors(flat, "cpu"), args)
    assert torch.equal(eager["td_loss"], graphed["td_loss"])
    assert all(torch.equal(a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True))
    obs = torch.from_numpy(batch["states"]["obs"])
    assert torch.equal(module.ObservationOnly(nets[0])(obs), nets[0]({"obs": obs}))


@pytest.mark.parametrize("module", [dqn, rb], ids=["dqn", "rainbow"])
def test_cuda_graph_on_a_cpu_is_a_one_line_error(tmp_path, monkeypatch, module):
    monkeypatch.chdir(tmp_path)
    args = module.Args(env_id="ALE/Breakout-v5", device="cpu", cuda_graph=True)
    with pytest.raises(SystemExit, match="--cuda-graph records CUDA graphs and needs a GPU"):
        module.main(args)
