"""Rules of envs/tetris.py on hand-built boards, and the batched engine against the Gymnasium env."""

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  (registers the ids)
from envs.tetris import (
    MAX_PLACEMENTS,
    VARIANTS,
    AfterstateEngine,
    ColumnEngine,
    I,
    O,
    S,
    TetrisEnv,
    Z,
    bertsekas_features,
    bit_length,
    bit_length_by_bitcast,
    boards_to_columns,
    columns_to_boards,
    num_placements,
    placements,
    rotations,
)


def board_from(rows, height=20, width=10):
    """Board from strings drawn bottom-aligned ('#' filled), padded with empty rows on top."""
    board = np.zeros((height, width), dtype=np.uint8)
    for i, row in enumerate(reversed(rows)):
        board[height - 1 - i] = [ch == "#" for ch in row]
    return board


def engine_step(board, piece, action, height=20, width=10):
    eng = AfterstateEngine(height, width, num_placements=MAX_PLACEMENTS)
    a = eng(torch.as_tensor(board)[None], torch.tensor([piece]))
    return a.boards[0, action].numpy(), int(a.rows_cleared[0, action]), bool(a.game_over[0, action]), a


def env_with(board, piece, variant="sz"):
    env = TetrisEnv(variant)
    env.reset(seed=0)
    env.board = board.copy()
    env.piece = piece
    return env


def test_rotation_and_placement_counts_match_the_paper():
    assert [len(rotations(p)) for p in range(7)] == [2, 1, 4, 2, 2, 4, 4]
    assert [num_placements(p) for p in range(7)] == [17, 9, 34, 17, 17, 34, 34]
    assert num_placements(S, width=6) == 4 + 5


def test_every_placement_on_an_empty_board_rests_on_the_floor_inside_its_columns():
    for piece in range(7):
        shapes = rotations(piece)
        for action, (rot, left) in enumerate(placements(piece)):
            board, cleared, over, _ = engine_step(np.zeros((20, 10), np.uint8), piece, action)
            assert not over and cleared == 0 and board.sum() == 4
            assert board[19].any()  # lowest cell on the floor
            cols = np.flatnonzero(board.any(0))
            width = max(c for _, c in shapes[rot]) + 1
            assert cols.min() == left and cols.max() == left + width - 1
            box_top = 20 - (max(rr for rr, _ in shapes[rot]) + 1)
            filled = {(r - box_top, c - left) for r, c in zip(*board.nonzero(), strict=True)}
            assert filled == set(shapes[rot])
            env = env_with(np.zeros((20, 10), np.uint8), piece)
            obs, reward, term, _, _ = env.step(action)
            assert np.array_equal(obs["board"], board) and reward == 0 and not term


def test_s_lying_lands_on_an_uneven_surface():
    # heights 2, 1, 0 under columns 0-2: S lying (.XX / XX.) rests on column 0's top -> bottom row of box at height 2
    board = board_from(["#.........", "##........"])
    out, cleared, over, _ = engine_step(board, S, 0)
    expected = board_from([".##.......", "##........", "#.........", "##........"])
    assert np.array_equal(out, expected) and cleared == 0 and not over


def test_z_standing_lands_on_its_lower_cell():
    # Z standing (.X / XX / X.) at column 0: its left column's lowest cell is at the box bottom, the right one 1 higher.
    # Heights 1 and 3: the right column decides (y0 = 3 - 1 = 2), leaving a hole above column 0's block.
    board = board_from([".#........", ".#........", "##........"])
    out, _, _, after = engine_step(board, Z, 8)  # placements 0..7 lying, 8.. standing: 8 = column 0
    expected = board_from([".#........", "##........", "##........", ".#........", "##........"])
    assert np.array_equal(out, expected)
    assert after.holes[0, 8] == 1 and after.heights[0, 8, :2].tolist() == [4, 5]


def test_piece_cannot_reach_under_an_overhang():
    board = board_from(["##........", "#.........", "#........."])  # column 1 covered at height 3, empty below
    vertical_i = next(a for a, (rot, col) in enumerate(placements(I)) if rot == 1 and col == 1)
    out, _, _, after = engine_step(board, I, vertical_i)
    assert out[:, 1].sum() == 5 and out[16:, 1].tolist() == [1, 1, 0, 0]  # stacked on top of the overhang
    assert after.holes[0, vertical_i] == 2  # the two cells under the overhang stay holes


@pytest.mark.parametrize("n_rows", [1, 2, 3, 4])
def test_one_to_four_rows_clear_at_once_and_the_rows_above_fall(n_rows):
    # bottom 4 rows all miss column 0; n_rows of them are otherwise full. A vertical I in column 0 completes those.
    above = ["..#.......", ".##......."]
    board = board_from(above + [".#.#.#.#.#"] * (4 - n_rows) + [".#########"] * n_rows)
    vertical_i = next(a for a, (rot, col) in enumerate(placements(I)) if rot == 1 and col == 0)
    out, cleared, over, after = engine_step(board, I, vertical_i)
    assert cleared == n_rows and not over
    assert np.array_equal(out, board_from(above + ["##.#.#.#.#"] * (4 - n_rows)))
    assert torch.equal(after.features()[0, vertical_i], bertsekas_features(torch.as_tensor(out)))
    env = env_with(board, I)
    obs, reward, term, _, _ = env.step(vertical_i)
    assert reward == n_rows and np.array_equal(obs["board"], out) and not term


def test_a_placement_that_does_not_fit_ends_the_game_and_leaves_the_board():
    board = board_from(["#........."] * 19 + ["##........"], height=20)  # column 0 at height 20
    _, _, over, after = engine_step(board, O, 0)
    assert over and np.array_equal(after.boards[0, 0].numpy(), board)
    assert not after.game_over[0, 5]  # O further right still fits
    env = env_with(board, O)
    obs, reward, term, _, _ = env.step(0)
    assert term and reward == 0 and np.array_equal(obs["board"], board)


def test_a_piece_that_would_complete_a_row_above_the_top_still_ends_the_game():
    # the SZ-Tetris rule (§3.1: an episode ends when a piece does not fit): it must fit before any clearing
    board = board_from(["####.#####"] + ["#########."] * 19)
    vertical_i = next(a for a, (rot, col) in enumerate(placements(I)) if rot == 1 and col == 4)
    _, cleared, over, _ = engine_step(board, I, vertical_i)
    assert over and cleared == 0


def greedy_policy(after, rng):
    """A line-clearing policy (few holes, low stack) so the random games exercise row clears."""
    feats = after.features()[0].float()
    bumpiness = feats[:, 10:19].abs().sum(-1)
    cost = 4 * feats[:, -1] + feats[:, :10].sum(-1) + 2 * bumpiness + 1e6 * after.game_over[0]
    cost += torch.as_tensor(rng.random(len(feats)), dtype=torch.float32) * 0.5
    cost[~after.valid[0]] = float("inf")
    return int(cost.argmin())


@pytest.mark.parametrize("env_id", ["envs/SZTetris-v0", "envs/Tetris-v0", "envs/Tetris10x10-v0"])
def test_batched_engine_equals_the_gymnasium_env_step_by_step(env_id):
    env = gym.make(env_id).unwrapped
    height, width, pieces = VARIANTS[env.unwrapped.spec.kwargs["variant"]]
    eng = AfterstateEngine(height, width, pieces, num_placements=MAX_PLACEMENTS)
    rng = np.random.default_rng(0)
    lines = steps = 0
    for game in range(12):
        obs, info = env.reset(seed=game)
        for _ in range(300):
            after = eng(torch.as_tensor(obs["board"])[None], torch.tensor([obs["piece"]]))
            assert np.array_equal(after.valid[0].numpy(), info["action_mask"].astype(bool))
            assert torch.equal(after.features()[0], bertsekas_features(after.boards[0]))
            explore = rng.random() < 0.05
            action = int(rng.choice(np.flatnonzero(info["action_mask"]))) if explore else greedy_policy(after, rng)
            obs, reward, term, _, info = env.step(action)
            steps += 1
            assert term == bool(after.game_over[0, action])
            assert np.array_equal(obs["board"], after.boards[0, action].numpy())
            assert reward == after.rows_cleared[0, action]
            lines += reward
            if term:
                break
    assert lines > 20 and steps > 500  # the comparison did cover row clears


def test_engine_is_batched_over_boards_and_pieces():
    rng = np.random.default_rng(1)
    boards = torch.as_tensor((rng.random((5, 20, 10)) < 0.3).astype(np.uint8))
    boards[:, :8] = 0
    pieces = torch.tensor([0, 2, 3, 5, 6])
    eng = AfterstateEngine()
    batched = eng(boards, pieces)
    for b in range(5):
        single = eng(boards[b : b + 1], pieces[b : b + 1])
        for field in batched._fields:
            assert torch.equal(getattr(batched, field)[b], getattr(single, field)[0]), field


@pytest.mark.parametrize("env_id", ["envs/SZTetris-v0", "envs/Tetris-v0", "envs/Tetris10x10-v0"])
def test_env_passes_gymnasium_checker(env_id):
    check_env(gym.make(env_id, render_mode="rgb_array").unwrapped, skip_render_check=False)


def test_env_is_deterministic_under_seed_and_a_deepcopy_continues_independently():
    def play(env, n, seed=None):
        out = []
        for _ in range(n):
            obs, r, term, _, _ = env.step(env.action_space.sample())
            out.append((obs["board"].tobytes(), obs["piece"], r, term))
            if term:
                env.reset()
        return out

    a, b = gym.make("envs/Tetris10x10-v0"), gym.make("envs/Tetris10x10-v0")
    a.reset(seed=7)
    b.reset(seed=7)
    a.action_space.seed(3)
    b.action_space.seed(3)
    assert play(a, 50) == play(b, 50)
    clone = copy.deepcopy(a)
    assert play(a, 40) == play(clone, 40)  # same state, same generators -> same future
    before = a.unwrapped.board.copy()
    play(clone, 5)
    assert np.array_equal(a.unwrapped.board, before)  # stepping the copy leaves the original alone


def test_undefined_placement_raises_a_clear_error():
    env = TetrisEnv("sz")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="not defined for piece"):
        env.step(20)  # S and Z have 17 placements
    with pytest.raises(ValueError, match="unknown Tetris variant"):
        TetrisEnv("pentris")


def test_render_modes():
    env = gym.make("envs/SZTetris-v0", render_mode="ansi")
    env.reset(seed=0)
    text = env.render()
    assert text.count("|") == 40 and "next:" in text
    env = gym.make("envs/SZTetris-v0", render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (320, 160, 3) and frame.dtype == np.uint8


@pytest.mark.parametrize("variant", ["sz", "tetris10x10", "tetris"])
def test_column_engine_equals_the_board_engine_along_random_play(variant):
    """ColumnEngine (column bits, the shallow agents' engine) against AfterstateEngine on every placement of 64
    boards for 300 moves of a hole-avoiding random player (many row clears, up to 4 at once on the 7-piece boards)."""
    H, W, pieces = VARIANTS[variant]
    old, new = AfterstateEngine(H, W, pieces), ColumnEngine(H, W, pieces)
    B, gen = 64, torch.Generator().manual_seed(1)
    boards = torch.zeros(B, H, W, dtype=torch.uint8)
    piece_ids, runs = torch.tensor(pieces), torch.arange(B)
    cleared = 0
    for _ in range(300):
        cur = piece_ids[torch.randint(len(pieces), (B,), generator=gen)]
        a, b = old(boards, cur), new(boards_to_columns(boards), cur)
        assert torch.equal(columns_to_boards(boards_to_columns(boards), H), boards)
        assert torch.equal(a.game_over, b.game_over) and torch.equal(a.valid, b.valid)
        v = a.valid
        for field in ("rows_cleared", "heights", "holes"):
            assert torch.equal(getattr(a, field)[v], getattr(b, field)[v]), field
        assert torch.equal(columns_to_boards(b.boards, H)[v], a.boards[v])
        cleared += int(a.rows_cleared[v].sum())
        cost = (a.holes * 5 + a.heights.amax(-1)).float() + 3 * torch.rand(v.shape, generator=gen)
        action = cost.masked_fill(~v | a.game_over, 1e9).argmin(-1)
        over = a.game_over[runs, action]
        boards = torch.where(over[:, None, None], 0, a.boards[runs, action]).to(torch.uint8)
    assert cleared > 1000


@pytest.mark.parametrize("fn", [bit_length, bit_length_by_bitcast])
def test_bit_length_equals_python_bit_length_up_to_2_pow_24(fn):
    x = torch.arange(1 << 24, dtype=torch.long)
    # int.bit_length is k on [2^(k-1), 2^k): a step of +1 at every power of two, 0 at 0
    expected = torch.zeros(1 << 24, dtype=torch.long)
    for k in range(24):
        expected[1 << k :] += 1
    assert torch.equal(fn(x), expected)
    values = (0, 1, 5, 1023, 1024, (1 << 24) - 1)
    assert [int(v) for v in fn(torch.tensor(values))] == [v.bit_length() for v in values]
