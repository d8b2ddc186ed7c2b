"""The reference's Atari-100k MoE agent (google/dopamine `labs/moes`: Atari100kRainbowMoEAgent with DER.gin) and
algos/rainbow_softmoe.py --preset der (DER.gin's network: Nature CNN, Soft MoE with 4 experts, or the baseline) in
lockstep: the same initial weights, the same transitions, the same minibatches, noise off on both sides.

    .refvenv/bin/python -W ignore results/reference_training/lockstep.py --dopamine-dir ../dopamine \
        --moe-type SOFTMOE --steps 4200 --out results/reference_training/lockstep.json

What each side runs is its own code:
- the reference: its agent object, replay memory (JAX ReplayBuffer: the n-step TransitionAccumulator, the prioritised
  SamplingDistribution and its SumTree), its own schedule (`_train_step`: learning once more than min_replay_history
  replay elements are stored, the target copied when training_steps is a multiple of 2,000), its sampling, its jitted
  train() with optax Adam, and its priority update;
- ours: rainbow_softmoe.py's FrameReplay (rows of frames, stacks and n-step windows rebuilt at sample time, SumTree),
  train_step (rainbow_loss, the script's Adam), update_priorities, and a target copy whenever the reference copies.
The transitions are one stream of real frames (Breakout by default, random actions, the atari100k protocol of
envs/atari.py and its EpisodeTracker, as the script's main loop stores them): ours gets every row main() would add, the
reference the same acted steps as its runner would log them (frame, action, clipped reward, terminal, episode end).
Noise: both networks use their NoisyNet means (the reference's NoisyNetwork takes its eval branch everywhere, the
experts included: dopamine_reference.noise_off; ours draws zeros for its noise, R.factorised_noise patched, so that its
train mode computes the means exactly); they draw noise from different generators, so a noisy lockstep could not be
compared.

Whenever the reference updates, ours updates on the minibatch the reference sampled (its keys mapped to our rows and the
importance weights recomputed from our own priorities). After every update: the batch (states, next states, actions,
n-step returns, discounts, weights), the new priorities and the online parameters; after every target copy: online
and target parameters, Adam's moments and step count, and every stored priority. Besides, the schedule ours would have
followed on its own (learning from agent step 1,601; target copies when the step crosses a multiple of 2,000) is
compared with the reference's.

"Parted": the first update after which the largest parameter difference reaches the learning rate (1e-4, about the
size of one Adam step), fixed before the first run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "benchmark"))
sys.path.insert(0, os.path.join(ROOT, "algos"))


def reverse_rows(batch_entry):
    """A batch's array, or each array of an inputs mapping, in reverse row order (the control's batch)."""
    if isinstance(batch_entry, dict):
        return {k: reverse_rows(v) for k, v in batch_entry.items()}
    return np.ascontiguousarray(batch_entry[::-1])


def trajectory(game: str, acted_steps: int, seed: int, num_actions_out: list) -> list[dict]:
    """Every row rainbow_softmoe.py's main() would add for a random policy, until `acted_steps` agent steps."""
    import rainbow_softmoe as R
    from envs import atari

    args = R.preset_args("der", env_id=f"ALE/{game}-v5")
    rom = atari.game_from_env_id(args.env_id)
    env = atari.make_env(args.protocol, rom, 1, args.max_episode_frames)
    num_actions = int(env.single_action_space.n)
    num_actions_out.append(num_actions)
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    tracker = atari.EpisodeTracker(1, args.protocol, info, rng)
    rows, acted = [], 0
    while acted < acted_steps:
        actions = rng.integers(0, num_actions, size=1).astype(np.int32)
        next_obs, rewards, terminated, truncated, info = env.step(tracker.actions(actions))
        step = tracker.step(rewards, terminated, truncated, info)
        rows.append(
            dict(
                frame=obs[0, -1].copy(),
                action=int(actions[0]),
                reward=float(np.clip(rewards[0], -1, 1)),
                terminal=bool(step.terminal[0]),
                valid=bool(step.valid[0]),
                history=int(step.history[0]),
                acted=bool(step.acted[0]),
                episode_end=bool(step.acted[0] and step.finished),
            )
        )
        acted += int(step.acted[0])
        obs = tracker.agent_view(next_obs)
    env.close()
    return rows


def replay_audit(agent, replay, elements_t: list, row_of_t: list, args) -> dict:
    """Every element the reference's replay holds, against our replay's transition for the same agent step: what
    differs (state, next state, n-step return, terminal, action), whether a differing stack only has older frames
    zeroed, and whether the element repeats a step the reference already holds."""
    from collections import Counter

    kinds, per_element, copies = Counter(), [], Counter()
    for key, t in enumerate(elements_t):
        element = agent._replay._memory[key].unpack()
        age, env = np.array([row_of_t[t]]), np.zeros(1, dtype=np.int64)
        sampleable = bool(replay.windows(age, env, args.n_step, args.gamma)[0][0])
        ours = replay.transitions(age, env, args.n_step, args.gamma, np.ones(1, dtype=np.float32))
        found = []
        for name, mine, theirs in (
            ("state", ours["states"]["obs"][0], element.state[0].transpose(2, 0, 1)),
            ("next_state", ours["next_states"]["obs"][0], element.next_state[0].transpose(2, 0, 1)),
        ):
            if not np.array_equal(mine, theirs):
                frames = [i for i in range(4) if not np.array_equal(mine[i], theirs[i])]
                zeroed = all(not theirs[i].any() for i in frames)
                found.append(f"{name}: frames {frames} {'zero in the reference' if zeroed else 'differ'}")
        if abs(float(ours["rewards"][0]) - float(element.reward[0])) > 1e-5:
            found.append("n-step return")
        if bool(ours["terminals"][0]) != bool(element.is_terminal[0]):
            found.append("terminal")
        if int(ours["actions"][0]) != int(element.action[0]):
            found.append("action")
        copies[t] += 1
        if copies[t] > 1:
            found.append("repeats a step already stored")
        if not sampleable:
            found.append("not sampleable in ours")
        kinds[" + ".join(found) or "identical"] += 1
        per_element.append(" + ".join(found) or "identical")
    return {
        "elements": len(elements_t),
        "distinct_steps": len(copies),
        "by_kind": dict(kinds.most_common()),
        "per_element": per_element,
    }


def sampled_kinds(updates: list, audit: dict) -> dict:
    """How often each kind of element was drawn into the lockstep's minibatches."""
    from collections import Counter

    drawn = Counter(audit["per_element"][k] for u in updates for k in u["sampled_keys"])
    return dict(drawn.most_common())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dopamine-dir", required=True)
    p.add_argument("--game", default="Breakout")
    p.add_argument("--moe-type", default="SOFTMOE", choices=["SOFTMOE", "BASELINE"])
    p.add_argument("--seed", type=int, default=1, help="the reference agent's seed (its initial weights, its sampler)")
    p.add_argument("--steps", type=int, default=4200, help="agent steps (learning starts after ~1,600)")
    p.add_argument("--out", default=os.path.join(HERE, "lockstep.json"))
    args = p.parse_args()

    import dopamine_reference

    # aliasing_as_shipped: this script hands the reference a fresh array every step (no aliasing to undo), and its
    # bookkeeping names a step by the identity of the array the accumulator keeps, which the copy would break
    ref = dopamine_reference.load(args.dopamine_dir, without_noise=True, aliasing_as_shipped=True)
    import torch

    import compare_with_dopamine as cw
    import rainbow_softmoe as R

    torch.set_num_threads(1)
    # noise off in ours: train_step puts the network in train mode, where NoisyNets draw; zeros give exactly the means
    R.factorised_noise = lambda shape, device: torch.zeros(shape, device=device)
    t_start = time.time()
    num_actions_box = []
    rows = trajectory(args.game, args.steps, args.seed, num_actions_box)
    num_actions = num_actions_box[0]
    print(
        f"{len(rows)} rows, {sum(r['acted'] for r in rows)} agent steps of {args.game}, "
        f"{sum(r['terminal'] for r in rows)} terminal, {sum(r['episode_end'] for r in rows)} episode ends",
        flush=True,
    )

    # --- the reference agent, as atari_100k_train.py builds it
    moe = "softmoe" if args.moe_type == "SOFTMOE" else "none"
    ref.run_experiment.load_gin_configs(
        [ref.der_gin], dopamine_reference.GIN_REPLAY + [f"FullRainbowMoENetwork.moe_type = '{args.moe_type}'"]
    )
    agent = ref.agent_module.Atari100kRainbowMoEAgent(num_actions=num_actions, seed=args.seed)
    agent.eval_mode = False

    # --- ours, from the reference's initial weights
    our_args = R.fill_defaults(
        R.preset_args(
            "der", env_id=f"ALE/{args.game}-v5", encoder="nature", moe=moe, num_experts=4 if moe != "none" else None
        )
    )
    cfg = dict(
        name="lockstep",
        family="rainbow",
        noisy=True,
        dueling=True,
        num_atoms=51,
        encoder="nature",
        moe=moe,
        num_experts=4,
        tokenization="perconv",
    )
    # channels_last as main() holds them. The control: a second copy of ours fed every minibatch in reverse order, the
    # same maths summed in another order, so its distance from ours is what float32 rounding alone does to two runs
    q_net = cw.loaded_network(cw.flatten(agent.online_params), cfg, num_actions).to(memory_format=torch.channels_last)
    target_net = cw.loaded_network(cw.flatten(agent.target_network_params), cfg, num_actions)
    target_net = target_net.to(memory_format=torch.channels_last).requires_grad_(False)
    optimizer = R.make_optimizer(q_net, our_args)
    control = cw.loaded_network(cw.flatten(agent.online_params), cfg, num_actions)
    control_target = cw.loaded_network(cw.flatten(agent.target_network_params), cfg, num_actions).requires_grad_(False)
    control_optimizer = R.make_optimizer(control, our_args)
    # teacher-forced: before every update this copy takes the reference's parameters, target and Adam state, so each
    # of its steps is one update of ours from exactly the reference's state (the one-update check at every update)
    forced = cw.loaded_network(cw.flatten(agent.online_params), cfg, num_actions).to(memory_format=torch.channels_last)
    forced_target = cw.loaded_network(cw.flatten(agent.target_network_params), cfg, num_actions)
    forced_target = forced_target.to(memory_format=torch.channels_last).requires_grad_(False)
    forced_optimizer = R.make_optimizer(forced, our_args)
    replay = R.FrameReplay(our_args.buffer_size, 1, prioritized=True)
    with torch.no_grad():
        features = tuple(q_net.encoder(torch.zeros(1, 4, 84, 84))[0].shape)
    names = [n for n, _ in q_net.named_parameters()]

    def as_ours(tree) -> dict:
        return cw.to_ours(cw.flatten(tree), cfg, features)

    def max_diff(a: dict, b: dict, keys) -> tuple[float, str]:
        diffs = {k: float((a[k].float() - b[k].float()).abs().max()) for k in keys}
        worst = max(diffs, key=diffs.get)
        return diffs[worst], worst

    # --- bookkeeping: which acted step each reference replay element holds, which of our rows each acted step is
    t_of_row, row_of_t = {}, []  # our row index <-> acted step t
    elements_t = []  # reference key (its add_count order) -> acted step t of its state's newest frame
    transitions = {}  # id of the observation array the reference stores -> (acted step t, the array)
    accumulator = agent._replay._transition_accumulator
    make_element = accumulator._make_replay_element

    def recording_make_element():
        element = make_element()
        if element is not None:
            trajectory_ = accumulator._trajectory
            last = trajectory_[-1]
            horizon = accumulator._update_horizon
            if last.is_terminal and len(trajectory_) <= horizon:
                horizon = len(trajectory_) - 1
            elements_t.append(transitions[id(trajectory_[len(trajectory_) - horizon - 1].observation)][0])
        return element

    accumulator._make_replay_element = recording_make_element
    sampler = agent._replay._sampling_distribution

    log = {"updates": [], "syncs": []}
    state = {"batch": None, "step": 0, "updates": 0, "parted": None, "max_param_diff": 0.0}
    sample = agent._sample_from_replay_buffer

    def recording_sample():
        sample()
        state["batch"] = {k: np.asarray(v) for k, v in agent.replay_elements.items()}

    agent._sample_from_replay_buffer = recording_sample
    reference_update = agent._training_step_update

    def update_both():
        """The reference's update, then ours on the very batch it sampled (its states, n-step returns, terminals and
        importance weights): the update path alone. What our replay would have given for the same steps is audited
        separately (replay_audit)."""
        before = (agent.online_params, agent.target_network_params, agent.optimizer_state[0])  # immutable pytrees
        reference_update()  # samples (recorded), trains, sets the priorities
        b = state["batch"]
        weights = 1.0 / np.sqrt(b["sampling_probabilities"] + 1e-10)  # as the reference computes its loss weights
        fed = {
            "states": {"obs": b["state"][:, 0].transpose(0, 3, 1, 2)},
            "next_states": {"obs": b["next_state"][:, 0].transpose(0, 3, 1, 2)},
            "actions": b["action"][:, 0].astype(np.int64),
            "rewards": b["reward"][:, 0].astype(np.float32),
            "terminals": b["terminal"][:, 0].astype(np.float32),
            "weights": (weights / weights.max()).astype(np.float32),
        }
        metrics = R.train_step(q_net, target_net, optimizer, R.to_tensors(fed, "cpu"), our_args)
        forced_step = teacher_forced_step(before, fed)
        reverse = {k: reverse_rows(v) for k, v in fed.items()}
        R.train_step(control, control_target, control_optimizer, R.to_tensors(reverse, "cpu"), our_args)
        state["updates"] += 1
        ours_p = np.sqrt(metrics["per_sample_loss"].detach().double().numpy() + 1e-10)  # update_priorities' formula
        keys, first = np.unique(b["indices"], return_index=True)
        ref_p = sampler._sum_tree.get(np.array([sampler._index_by_key[k] for k in keys]))
        online = as_ours(agent.online_params)
        diff, where = max_diff(q_net.state_dict(), online, names)
        state["max_param_diff"] = max(state["max_param_diff"], diff)
        control_diff = max_diff(q_net.state_dict(), control.state_dict(), names)[0]
        entry = {
            "update": state["updates"],
            "step": state["step"],
            "max_param_diff": diff,
            "worst_param": where,
            "control_max_param_diff": control_diff,
            **forced_step,
            "max_priority_diff": float(np.abs(ours_p[first] - ref_p).max()),
            "max_priority_rel_diff": float((np.abs(ours_p[first] - ref_p) / ref_p).max()),
            "sampled_keys": b["indices"].tolist(),
        }
        log["updates"].append(entry)
        if state["parted"] is None and diff >= our_args.learning_rate:
            state["parted"] = state["updates"]
        if state["updates"] % 100 == 0 or state["updates"] <= 3:
            print(
                f"update {state['updates']} (step {state['step']}): max|dθ| {diff:.2e} in {where} (ours against the "
                f"control: {control_diff:.2e}), new priorities "
                f"max rel. diff {entry['max_priority_rel_diff']:.1e}, {time.time() - t_start:.0f} s",
                flush=True,
            )
        if state["updates"] % 100 == 0:  # the run so far, in case it is stopped before its end (complete: false)
            write_partial()

    def compared() -> dict:
        """What the updates so far compared: the final lockstep.json and the one written every 100 updates."""
        updates = log["updates"]
        return {
            "updates_compared": len(updates),
            "target_syncs": [s["step"] for s in log["syncs"]],
            "largest_parameter_difference": state["max_param_diff"],
            "first_update_parted": state["parted"],
            "parted_threshold": our_args.learning_rate,
            "largest_new_priority_difference": max((u["max_priority_diff"] for u in updates), default=None),
            "largest_new_priority_relative_difference": max(
                (u["max_priority_rel_diff"] for u in updates), default=None
            ),
            "syncs": log["syncs"],
            "teacher_forced": {
                "updates": len(updates),
                "largest_parameter_difference": max((u["forced_max_param_diff"] for u in updates), default=None),
                "largest_difference_over_step": max(
                    (u["forced_max_param_diff"] / u["forced_largest_step"] for u in updates), default=None
                ),
            },
            "largest_control_difference": max((u["control_max_param_diff"] for u in updates), default=None),
            "first_update_control_parted": next(
                (u["update"] for u in updates if u["control_max_param_diff"] >= our_args.learning_rate), None
            ),
            "param_diff_every_100_updates": [
                (u["update"], u["max_param_diff"], u["control_max_param_diff"], u["worst_param"])
                for u in updates
                if u["update"] % 100 == 0 or u["update"] in (1, 10)
            ],
        }

    def write(result: dict):
        with open(f"{args.out}.tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(f"{args.out}.tmp", args.out)

    def write_partial():
        head = {"complete": False, "game": args.game, "moe_type": args.moe_type, "seed": args.seed}
        write(head | {"agent_steps_so_far": state["step"]} | compared())

    def teacher_forced_step(before, fed) -> dict:
        """Ours from the reference's state before this update, one step on the same batch, against the reference's
        state after it: the largest parameter difference, and the largest parameter change of the step itself."""
        online, target, adam = before
        with torch.no_grad():
            for name, value in as_ours(online).items():
                if name in dict(forced.named_parameters()):
                    dict(forced.named_parameters())[name].copy_(value)
            forced_target.load_state_dict(as_ours(target) | {"support": forced_target.support}, strict=True)
        start = {k: v.clone() for k, v in forced.state_dict().items()}
        mu, nu, count = as_ours(adam.mu), as_ours(adam.nu), int(adam.count)
        have_state = count > 0 and all(p in forced_optimizer.state for p in forced.parameters() if p.grad is not None)
        if have_state:
            for name, param in forced.named_parameters():
                if param in forced_optimizer.state:
                    st = forced_optimizer.state[param]
                    st["exp_avg"].copy_(mu[name])
                    st["exp_avg_sq"].copy_(nu[name])
                    st["step"].fill_(count)
        R.train_step(forced, forced_target, forced_optimizer, R.to_tensors(fed, "cpu"), our_args)
        if not have_state and count > 0:
            raise RuntimeError("teacher forcing needs our Adam state from the first update on")
        after = as_ours(agent.online_params)
        mine = forced.state_dict()
        diff = max(float((mine[k] - after[k]).abs().max()) for k in names)
        change = max(float((after[k] - start[k]).abs().max()) for k in names)
        return {"forced_max_param_diff": diff, "forced_largest_step": change}

    agent._training_step_update = update_both
    reference_sync = agent._sync_weights

    def sync_both():
        reference_sync()
        target_net.load_state_dict(q_net.state_dict())
        control_target.load_state_dict(control.state_dict())
        online, target = as_ours(agent.online_params), as_ours(agent.target_network_params)
        adam = agent.optimizer_state[0]
        mu, nu = as_ours(adam.mu), as_ours(adam.nu)
        ours_mu, ours_nu, steps = {}, {}, set()
        for name, param in q_net.named_parameters():
            if param in optimizer.state:
                ours_mu[name], ours_nu[name] = optimizer.state[param]["exp_avg"], optimizer.state[param]["exp_avg_sq"]
                steps.add(int(optimizer.state[param]["step"]))
        keys = sorted(ours_mu)
        untouched = [k for k in names if k not in ours_mu]  # the sigmas: no gradient with the noise off
        entry = {
            "step": state["step"],
            "updates": state["updates"],
            "online": max_diff(q_net.state_dict(), online, names)[0],
            "target": max_diff(target_net.state_dict(), target, names)[0],
            "adam_mu": max_diff(ours_mu, mu, keys)[0],
            "adam_nu": max_diff(ours_nu, nu, keys)[0],
            "adam_mu_of_untouched": max((float(mu[k].abs().max()) for k in untouched), default=0.0),
            "adam_count": int(adam.count),
            "our_adam_steps": sorted(steps),
        }
        log["syncs"].append(entry)
        print(f"sync at step {state['step']}: {entry}", flush=True)

    agent._sync_weights = sync_both

    # --- ours' own schedule beside the reference's
    our_first_update, ref_first_update = None, None
    t = 0
    for row in rows:
        if row["acted"]:
            state["step"] = t
            if our_first_update is None and t > our_args.learning_starts:
                our_first_update = t  # main(): global_step > learn_from (and can_sample)
            before = state["updates"]
            agent._train_step()  # the reference's schedule (its runner calls it before acting at every agent step)
            if ref_first_update is None and state["updates"] > before:
                ref_first_update = t
        replay.add(
            frames=row["frame"][None],
            actions=np.array([row["action"]]),
            rewards=np.array([row["reward"]]),
            terminals=np.array([row["terminal"]]),
            valid=np.array([row["valid"]]),
            history=np.array([row["history"]]),
        )
        if row["acted"]:
            t_of_row[replay.count - 1] = t
            row_of_t.append(replay.count - 1)
            # as its runner logs them: arrays over its one env, rewards, terminals and episode ends as float64
            observation = row["frame"][None]
            transitions[id(observation)] = (t, observation)  # the accumulator keeps this array: it names the step
            agent._store_transition(
                observation,
                np.array([row["action"]]),
                np.array([row["reward"]]),
                np.array([float(row["terminal"])]),
                episode_end=np.array([float(row["episode_end"])]),
            )
            t += 1

    audit = replay_audit(agent, replay, elements_t, row_of_t, our_args)
    result = {
        "complete": True,
        "game": args.game,
        "moe_type": args.moe_type,
        "seed": args.seed,
        "agent_steps": t,
        "first_update_step": {"reference": ref_first_update, "ours_schedule": our_first_update},
        **compared(),
        "replay_audit": {k: v for k, v in audit.items() if k != "per_element"},
        "sampled_elements_by_kind": sampled_kinds(log["updates"], audit),
        "wall_time_s": time.time() - t_start,
    }
    write(result)
    print(json.dumps({k: v for k, v in result.items() if k not in ("syncs", "param_diff_every_100_updates")}, indent=1))


if __name__ == "__main__":
    main()
