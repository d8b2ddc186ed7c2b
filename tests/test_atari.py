"""envs/atari.py: the protocols' episode bookkeeping on the real emulator, the evaluation loop, ROM names and the
random / human reference scores. (The replay memories that store what the tracker reports are tested with their
scripts: test_dqn_softmoe.py rebuilds every stack the environment returned.)"""

import csv
import os

import numpy as np
import pytest

from envs import atari

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_atari100k_episodes_start_with_0_to_29_noop_agent_steps_that_are_not_learned_or_counted():
    """Dopamine's 100k runner: k ~ U{0..29} agent steps of action 0 after every reset, not stored as transitions,
    not counted, not scored; the agent's first stack starts after them."""
    n = 16
    envs = atari.make_env("atari100k", "breakout", n, 108_000)
    obs, info = envs.reset(seed=0)
    assert (np.asarray(info["episode_frame_number"]) == 0).all()  # ale_py itself adds no no-op frames
    tracker = atari.EpisodeTracker(n, "atari100k", info, np.random.default_rng(5))
    want, first_acted = np.random.default_rng(5).integers(0, 30, n), np.full(n, -1)
    for t in range(32):
        sent = tracker.actions(np.full(n, 3, dtype=np.int32))
        assert ((sent == 0) == (t < want)).all()
        next_obs, rewards, terminated, truncated, info = envs.step(sent)
        step = tracker.step(rewards, terminated, truncated, info)
        assert (step.acted == (t >= want)).all() and not step.valid[t < want].any()
        new = step.acted & (first_acted < 0)
        first_acted[new] = t
        assert (step.history[new] == 0).all()  # the first acted step began from a stack of its own frame alone
        assert (np.asarray(info["episode_frame_number"])[new] == 4 * (want[new] + 1)).all()
    assert (first_acted == want).all() and len(set(want.tolist())) > 8
    envs.close()


@pytest.mark.parametrize("protocol", atari.PROTOCOLS)
def test_each_protocol_sets_sticky_actions_noop_starts_and_lost_lives_as_its_reference(protocol):
    """Random Breakout play under each protocol: a lost life is terminal (and starts a new stack) only under nature
    and atari100k; every episode's return and length are those of the acted steps."""
    n = 4
    envs = atari.make_env(protocol, "breakout", n, 2000)
    obs, info = envs.reset(seed=1)
    tracker, rng = atari.EpisodeTracker(n, protocol, info, np.random.default_rng(0)), np.random.default_rng(1)
    returns, lengths, finished, lost_life_terminal = np.zeros(n), np.zeros(n, int), [], False
    for _ in range(1500):
        next_obs, rewards, terminated, truncated, info = envs.step(tracker.actions(rng.integers(0, 4, n)))
        lives_before = tracker.lives.copy()
        step = tracker.step(rewards, terminated, truncated, info)
        lost = (np.asarray(info["lives"]) < lives_before) & (np.asarray(info["lives"]) > 0)
        lost_life_terminal |= bool((step.terminal & lost).any())
        returns += np.where(step.acted, rewards, 0)
        lengths += step.acted
        for env, episode_return, length in step.finished:
            finished.append((episode_return, length) == (returns[env], lengths[env]))
            returns[env], lengths[env] = 0, 0
        if len(finished) >= 2 * n:  # every protocol has lost lives by then: a game ends only after its last
            break
    envs.close()
    assert len(finished) >= n and all(finished)
    assert lost_life_terminal == (protocol != "dopamine")


def test_evaluation_plays_one_game_per_env_in_env_order_or_the_games_that_end_within_a_step_budget():
    def act(obs, tracker, live):  # a fixed policy: FIRE or right, given every env's stacks and the tracker
        assert len(obs) == len(live) == len(tracker.returns)
        return np.where(np.arange(len(obs)) % 2 == 0, 1, 2).astype(np.int32)[live]

    games = [atari.evaluate(act, "atari100k", "breakout", 3, 400, 7, np.random.default_rng(3)) for _ in range(2)]
    assert games[0] == games[1] and len(games[0]) == 3  # the same seeds: the same games
    assert all(0 < length <= 100 for _, length in games[0])  # 400 frames = 100 agent steps, no-ops not counted
    budget = [atari.evaluate(act, "dopamine", "breakout", 2, 400, 7, np.random.default_rng(3), step_budget=b)
              for b in (150, 250)]  # fmt: skip
    assert budget[0] == [] and budget[1] == [(budget[1][0][0], 100), (budget[1][1][0], 100)]  # both cut at 100 steps


def test_env_ids_map_to_roms_and_unknown_ones_suggest_close_names():
    assert atari.game_from_env_id("ALE/MsPacman-v5") == "ms_pacman" and atari.camel_name("ms_pacman") == "MsPacman"
    assert atari.game_from_env_id("ALE/Pong-v5") == "pong" and atari.game_from_env_id("ALE/TicTacToe3D-v5")
    assert atari.game_from_env_id("PongNoFrameskip-v4") is None and atari.game_from_env_id("ALE/Pongg-v5") is None
    assert "ALE/Pong-v5" in atari.unknown_env_message("ALE/Pongg-v5")
    assert "ALE/SpaceInvaders-v5" in atari.unknown_env_message("SpaceInvader")
    assert atari.num_game_actions("pong") == 6 and atari.num_game_actions("breakout") == 4


def test_human_normalised_score_by_hand_and_the_table_from_the_csv():
    assert atari.human_normalized(14.6, "pong") == pytest.approx(1.0)  # Pong: random -20.7, human 14.6
    assert atari.human_normalized(-20.7, "pong") == pytest.approx(0.0)
    assert atari.human_normalized((1.7 + 30.5) / 2, "breakout") == pytest.approx(0.5)  # Breakout: 1.7, 30.5
    assert atari.human_normalized(10.0, "air_raid") is None  # no reference score exists
    assert atari.human_normalized(None, "pong") is None and atari.human_normalized(float("nan"), "pong") is None
    with open(os.path.join(ROOT, "envs", "atari_scores.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(atari.RANDOM_HUMAN_SCORES) == 57 == sum(bool(r["human"]) for r in rows)  # Atari-57
    assert atari.RANDOM_HUMAN_SCORES["Asterix"] == (210.0, 8503.3)


def test_the_video_schedule_is_gymnasiums_capped_cubic_one():
    wanted = [e for e in range(3001) if atari.EpisodeVideo.wanted(e)]
    assert wanted == [0, 1, 8, 27, 64, 125, 216, 343, 512, 729, 1000, 2000, 3000]
