"""The 20 Bertsekas-style features (§3.1) and their binary encoding (our choice, envs.tetris.binary_feature_indices)."""

import numpy as np
import torch

from envs.tetris import (
    bertsekas_features,
    binary_feature_indices,
    binary_feature_length,
    binary_features,
    column_heights,
    holes,
)
from tests.test_tetris_rules import board_from


def test_binary_vector_lengths_are_the_papers_460_and_260():
    assert binary_feature_length(20) == 460 and binary_feature_length(10) == 260
    assert binary_features(torch.zeros(20, 10, dtype=torch.uint8)).shape == (460,)
    assert binary_features(torch.zeros(3, 10, 10, dtype=torch.uint8)).shape == (3, 260)


def test_exactly_one_active_bit_per_feature_block():
    rng = np.random.default_rng(0)
    for height in (20, 10):
        boards = torch.as_tensor((rng.random((200, height, 10)) < rng.random((200, 1, 1))).astype(np.uint8))
        x = binary_features(boards)
        bins = height + 1
        blocks = [bins] * 19 + [height + 41]
        starts = np.cumsum([0] + blocks)
        assert x.shape[-1] == starts[-1]
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            assert torch.all(x[:, a:b].sum(-1) == 1)


def test_features_on_a_hand_built_board():
    board = torch.as_tensor(
        board_from(
            [
                "#.........",
                "#.#.......",
                "..#......#",
                "###......#",
            ]
        )
    )
    assert column_heights(board).tolist() == [4, 1, 3, 0, 0, 0, 0, 0, 0, 2]
    assert int(holes(board)) == 1  # the empty cell of column 0 under its two top cells
    feats = bertsekas_features(board)
    assert feats.tolist() == [4, 1, 3, 0, 0, 0, 0, 0, 0, 2, -3, 2, -3, 0, 0, 0, 0, 0, 2, 1]
    idx = binary_feature_indices(feats, 20).tolist()
    bins = 21
    assert idx[0] == 4 and idx[1] == bins + 1 and idx[9] == 9 * bins + 2
    assert idx[10] == 10 * bins + (-3 + 10)  # signed difference h1 - h0 = -3, offset by H/2
    assert idx[19] == 19 * bins + 1


def test_large_differences_and_hole_counts_are_clipped():
    board = torch.zeros(20, 10, dtype=torch.uint8)
    board[1:, 0] = 1  # column 0 at height 19; its neighbour is empty: difference -19 clips to -10
    board[0, 5] = 1  # a lid on column 5: 19 holes below
    board[0, 6:] = 1
    feats = bertsekas_features(board)
    assert feats[10] == -19 and feats[-1] == 19 * 5
    idx = binary_feature_indices(feats, 20)
    assert idx[10] == 10 * 21 + 0  # clipped to -H/2
    assert idx[19] == 19 * 21 + 60  # holes clipped to H + 40
