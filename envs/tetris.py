"""Placement-level Tetris and stochastic SZ-Tetris (Elfwing, Uchibe & Doya 2018, §3.1-3.2).

The only code the scripts share. Three layers, each usable on its own:

1. Rules: the seven tetrominoes with ids I, O, T, S, Z, J, L = 0..6, their distinct rotations, and the placement
   table (a placement = a rotation plus the column of the piece's left edge; the piece drops straight down).
   On a 10-wide board that gives 17 placements for I, S and Z, 9 for O and 34 for T, J and L.
2. `AfterstateEngine`: for B boards and their current pieces, one batched torch call returns every placement's
   afterstate (full rows cleared), the rows cleared, the game-over flag and a validity mask. This is what the
   agents use: no Python loop over placements or boards.
3. `TetrisEnv`: a Gymnasium environment with its own plain NumPy simulation of the same rules (written
   independently of the engine, so the two can be checked against each other), registered on `import envs` as
   `envs/SZTetris-v0`, `envs/Tetris-v0` (10x20, seven pieces) and `envs/Tetris10x10-v0`.

Plus the state features of §3.1: 10 column heights, 9 signed adjacent height differences, the number of holes, and
their binary encoding (460 inputs at 10x20, 260 at 10x10); and `TetrisVideo`, batched boards as mp4.

Game-over rule ("an episode ends when a tetromino does not fit within the board", §3.1; read as Szita & Szepesvari's
SZ-Tetris code does, Szepi/sztetris-rl src/tetrisengine/AfterState.java putTile; our choice for every variant): a
placement is allowed only if all four cells rest inside the board *before* any row is cleared; playing one that does
not fit ends the game and leaves the board as it was.

Coordinates: boards are (H, W) arrays of 0/1 with row 0 at the top, as the observation shows them.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

PIECE_NAMES = ("I", "O", "T", "S", "Z", "J", "L")
I, O, T, S, Z, J, L = range(7)  # noqa: E741  (the pieces are named by their letters)
MAX_PLACEMENTS = 34  # T, J and L on a 10-wide board; the size of every variant's action space

# Pieces drawn in their spawn orientation, top row first ("X" = cell).
_PIECE_PICTURES = {
    I: ["XXXX"],
    O: ["XX", "XX"],
    T: [".X.", "XXX"],
    S: [".XX", "XX."],
    Z: ["XX.", ".XX"],
    J: ["X..", "XXX"],
    L: ["..X", "XXX"],
}

# Variants: (height, width, pieces drawn uniformly at random)
VARIANTS = {
    "sz": (20, 10, (S, Z)),
    "tetris": (20, 10, tuple(range(7))),
    "tetris10x10": (10, 10, tuple(range(7))),
}


# ----------------------------------------------------------------------------------------------------------------------
# 1. Rules: rotations and the placement table
# ----------------------------------------------------------------------------------------------------------------------
def _normalise(cells):
    """Shift (row, col) cells so the bounding box starts at (0, 0); sorted, hashable."""
    r0 = min(r for r, _ in cells)
    c0 = min(c for _, c in cells)
    return tuple(sorted((r - r0, c - c0) for r, c in cells))


def rotations(piece: int) -> list[tuple[tuple[int, int], ...]]:
    """Distinct rotations of a piece as (row, col) cells with row 0 at the top of its bounding box.

    The spawn picture first, then successive clockwise quarter turns, duplicates dropped (a 180-degree turn of I, S or
    Z gives the same cells; every turn of O does): I 2, O 1, T 4, S 2, Z 2, J 4, L 4.
    """
    picture = _PIECE_PICTURES[piece]
    cells = [(r, c) for r, row in enumerate(picture) for c, ch in enumerate(row) if ch == "X"]
    distinct = []
    for _ in range(4):
        shape = _normalise(cells)
        if shape not in distinct:
            distinct.append(shape)
        cells = [(c, -r) for r, c in cells]  # clockwise quarter turn
    return distinct


def placements(piece: int, width: int = 10) -> list[tuple[int, int]]:
    """The placement table of a piece: index -> (rotation, left column). Rotations in `rotations` order."""
    table = []
    for rot, shape in enumerate(rotations(piece)):
        piece_width = max(c for _, c in shape) + 1
        table.extend((rot, col) for col in range(width - piece_width + 1))
    return table


def num_placements(piece: int, width: int = 10) -> int:
    return len(placements(piece, width))


def action_mask(piece: int, width: int = 10) -> np.ndarray:
    """(34,) int8 mask of the placement indices defined for `piece`."""
    mask = np.zeros(MAX_PLACEMENTS, dtype=np.int8)
    mask[: num_placements(piece, width)] = 1
    return mask


# ----------------------------------------------------------------------------------------------------------------------
# 2. Features (§3.1): Bertsekas-style heights, signed differences and holes, and their binary encoding
# ----------------------------------------------------------------------------------------------------------------------
def column_heights(boards: torch.Tensor) -> torch.Tensor:
    """(..., H, W) 0/1 boards -> (..., W) heights: rows from the floor up to the highest filled cell (0 if empty)."""
    height = boards.shape[-2]
    row_height = torch.arange(height, 0, -1, device=boards.device, dtype=torch.uint8)  # H at the top row .. 1
    return (boards.to(torch.uint8) * row_height[:, None]).amax(-2).long()


def holes(boards: torch.Tensor) -> torch.Tensor:
    """(..., H, W) -> (...) number of empty cells with at least one filled cell above them in their column.

    Every filled cell lies at or below its column's highest filled cell, so a column holds height - filled holes.
    """
    return column_heights(boards).sum(-1) - boards.to(torch.uint8).sum((-2, -1))


def features_from_heights(heights: torch.Tensor, n_holes: torch.Tensor) -> torch.Tensor:
    """(..., W) heights and (...) holes -> (..., 2W): W heights, W-1 signed differences h[k+1]-h[k], holes (§3.1)."""
    return torch.cat([heights, heights[..., 1:] - heights[..., :-1], n_holes[..., None]], -1)


def bertsekas_features(boards: torch.Tensor) -> torch.Tensor:
    """(..., H, W) boards -> (..., 2W) integer features (see `features_from_heights`)."""
    return features_from_heights(column_heights(boards), holes(boards))


def binary_feature_length(height: int, width: int = 10) -> int:
    """Length of the binary state vector: 460 at 10x20 and 260 at 10x10 (the paper's numbers)."""
    return (2 * width - 1) * (height + 1) + height + 41


@functools.lru_cache(maxsize=16)
def _encoding_table(height: int, width: int, device: torch.device) -> torch.Tensor:
    """(3, 2W) lower clip, upper clip and block offset of each feature in the binary vector."""
    bins, half = height + 1, height // 2
    lo = [0] * width + [-half] * (width - 1) + [0]
    hi = [height] * width + [half] * (width - 1) + [height + 40]
    offset = [k * bins for k in range(width)] + [(width + k) * bins + half for k in range(width - 1)]
    offset.append((2 * width - 1) * bins)
    return torch.tensor([lo, hi, offset], device=device)


def binary_feature_indices(features: torch.Tensor, height: int) -> torch.Tensor:
    """(..., 2W) integer features -> (..., 2W) indices of the active bits in the binary state vector.

    Our choice (the paper, §3.1-3.2, gives only the lengths 460 and 260): one-hot blocks of H+1 bins per column height
    (0..H), H+1 bins per signed difference clipped to [-H/2, H/2], and H+41 bins for the holes clipped to 0..H+40.
    Exactly one bit is active per feature, 2W = 20 in all.
    """
    lo, hi, offset = _encoding_table(height, features.shape[-1] // 2, features.device)
    return torch.maximum(torch.minimum(features, hi), lo) + offset


def binary_features(boards: torch.Tensor) -> torch.Tensor:
    """(..., H, W) boards -> (..., F) float 0/1 binary state vectors (F = 460 at 10x20)."""
    height, width = boards.shape[-2:]
    idx = binary_feature_indices(bertsekas_features(boards), height)
    out = torch.zeros(*idx.shape[:-1], binary_feature_length(height, width), device=boards.device)
    return out.scatter_(-1, idx, 1.0)


# ----------------------------------------------------------------------------------------------------------------------
# 3. The batched afterstate engine
# ----------------------------------------------------------------------------------------------------------------------
class Afterstates(NamedTuple):
    boards: torch.Tensor  # (B, P, H, W) uint8: board after the drop and the row clears (the input board if game over)
    rows_cleared: torch.Tensor  # (B, P) long
    game_over: torch.Tensor  # (B, P) bool: the piece does not fit inside the board (always True where not valid)
    valid: torch.Tensor  # (B, P) bool: the placement index is defined for the piece
    heights: torch.Tensor  # (B, P, W) long: column heights of each afterstate
    holes: torch.Tensor  # (B, P) long: holes of each afterstate

    def features(self) -> torch.Tensor:
        """(B, P, 2W) Bertsekas-style features of every afterstate, equal to bertsekas_features(self.boards)."""
        return features_from_heights(self.heights, self.holes)


class AfterstateEngine:
    """Every placement's afterstate for B boards at once.

    Drop rule: with column heights h, a rotation whose lowest cell in its j-th column sits `bottom[j]` rows above the
    bounding box's bottom, placed with its left edge at column c, comes to rest with the box's bottom row at
    y0 = max_j(h[c+j] - bottom[j]) (rows counted from the floor). It fits iff y0 + box height <= H.

    The afterstate's heights and holes follow without scanning the new boards: a covered column's height becomes
    y0 + top[j] (its highest piece cell), and the piece adds y0 + bottom[j] - h[c+j] holes under its lowest cell in each
    covered column. Row clears are rare, so full rows are found from per-row cell counts, and only the boards that clear
    rows are compacted and rescanned.

    `num_placements` (P) defaults to the largest placement count among the variant's pieces (17 for SZ-Tetris,
    34 otherwise), so SZ-Tetris agents do not carry 17 padding slots.
    """

    def __init__(self, height: int = 20, width: int = 10, pieces=tuple(range(7)), device="cpu", num_placements=None):
        self.height, self.width, self.device = height, width, torch.device(device)
        if num_placements is None:
            num_placements = max(len(placements(p, width)) for p in pieces)
        self.num_placements = P = num_placements
        valid = torch.zeros(7, P, dtype=torch.bool)
        cols = torch.zeros(7, P, 4, dtype=torch.long)  # board column of each cell
        dy = torch.zeros(7, P, 4, dtype=torch.long)  # cell height above the box's bottom row
        bottom = torch.full((7, P, width), 10**6, dtype=torch.long)  # lowest cell per board column; huge = not covered
        top = torch.full((7, P, width), -(10**6), dtype=torch.long)  # 1 + highest cell per board column
        box_height = torch.full((7, P), 10**6, dtype=torch.long)  # undefined slots never fit: they change nothing
        bottom[:, :, 0] = 0
        for piece in range(7):
            shapes = rotations(piece)
            for p, (rot, left) in enumerate(placements(piece, width)[:P]):
                shape = shapes[rot]
                h = max(r for r, _ in shape) + 1
                valid[piece, p] = True
                box_height[piece, p] = h
                bottom[piece, p, 0] = 10**6
                for k, (r, c) in enumerate(shape):
                    cols[piece, p, k] = left + c
                    dy[piece, p, k] = h - 1 - r
                for c in {c for _, c in shape}:
                    bottom[piece, p, left + c] = min(h - 1 - r for r, cc in shape if cc == c)
                    top[piece, p, left + c] = max(h - r for r, cc in shape if cc == c)
        self.valid = valid.to(self.device)
        # one gather per call: [bottom (W) | top (W) | box height (1) | cell columns (4) | cell heights (4)]
        self.table = torch.cat([bottom, top, box_height[..., None], cols, dy], -1).to(self.device)
        self.row_height = torch.arange(height, 0, -1, dtype=torch.uint8, device=self.device)[:, None]

    def __call__(self, boards: torch.Tensor, pieces: torch.Tensor) -> Afterstates:
        """boards (B, H, W) 0/1, pieces (B,) long -> Afterstates with P placements per board."""
        B, H, W = boards.shape
        P = self.num_placements
        boards = boards.to(torch.uint8)
        heights = (boards * self.row_height).amax(-2).long()  # (B, W), as column_heights
        row_fill = boards.sum(-1)  # (B, H) cells per row
        n_holes = heights.sum(-1) - row_fill.sum(-1)  # (B,)
        table = self.table[pieces]  # (B, P, 2W + 9)
        bottom, top, box_height = table[..., :W], table[..., W : 2 * W], table[..., 2 * W]
        cols, dy = table[..., 2 * W + 1 : 2 * W + 5], table[..., 2 * W + 5 :]
        covered = bottom < H
        y0 = (heights[:, None, :] - bottom).amax(-1)  # (B, P) resting row of the box's bottom, from the floor
        game_over = y0 + box_height > H
        fits = ~game_over
        rows = (H - 1 - (y0[..., None] + dy)).clamp(0, H - 1)  # (B, P, 4) cell rows, top = 0
        cell = fits.to(torch.uint8)[..., None].expand(B, P, 4)
        after = boards[:, None].expand(B, P, H, W).reshape(B, P, H * W).clone()
        after.scatter_reduce_(-1, rows * W + cols, cell, reduce="amax")  # a piece that does not fit adds 0
        after = after.view(B, P, H, W)
        # Heights and holes before any row is cleared.
        new_heights = torch.where(covered & fits[..., None], y0[..., None] + top, heights[:, None, :])
        gaps = (y0[..., None] + bottom - heights[:, None, :]) * covered
        new_holes = n_holes[:, None] + gaps.sum(-1) * fits
        fill = row_fill[:, None, :].expand(B, P, H).to(torch.long).scatter_add(-1, rows, cell.to(torch.long))
        full = fill == W  # (B, P, H)
        rows_cleared = full.sum(-1)
        cleared = rows_cleared > 0
        if bool(cleared.any()):  # rare: compact only the boards that clear rows, then rescan them
            sub, sub_full = after[cleared], full[cleared]  # (n, H, W), (n, H)
            # A stable sort moves the full rows to the top in their order and keeps the others' order; blank them.
            keep_sorted, order = (~sub_full).to(torch.uint8).sort(dim=-1, stable=True)
            sub = sub.gather(1, order[..., None].expand_as(sub)) * keep_sorted[..., None]
            after[cleared] = sub
            sub_heights = column_heights(sub)
            new_heights[cleared] = sub_heights
            new_holes[cleared] = sub_heights.sum(-1) - sub.sum((-2, -1))  # as holes(), without rescanning heights
        return Afterstates(after, rows_cleared, game_over, self.valid[pieces], new_heights, new_holes)


def boards_to_columns(boards: torch.Tensor) -> torch.Tensor:
    """(..., H, W) 0/1 boards -> (..., W) int64 column bits: bit y of column j is the cell y rows above the floor."""
    height = boards.shape[-2]
    bit = 1 << torch.arange(height - 1, -1, -1, device=boards.device)  # row 0 (the top) is bit H-1
    return (boards.long() * bit[:, None]).sum(-2)


def columns_to_boards(columns: torch.Tensor, height: int) -> torch.Tensor:
    """(..., W) column bits -> (..., H, W) uint8 boards with row 0 at the top (the inverse of boards_to_columns)."""
    bit = torch.arange(height - 1, -1, -1, device=columns.device)
    return ((columns[..., None, :] >> bit[:, None]) & 1).to(torch.uint8)


def bit_length(columns: torch.Tensor) -> torch.Tensor:
    """The bit length of non-negative integers below 2^24 (a column's height), 0 for 0. Eagerly frexp's exponent (one
    ATen kernel); under torch.compile `bit_length_by_bitcast`, which inductor turns into a few integer instructions
    where frexp stays a libm call per element."""
    if torch.compiler.is_compiling():
        return bit_length_by_bitcast(columns)
    return torch.frexp(columns.float())[1].long()


def bit_length_by_bitcast(columns: torch.Tensor) -> torch.Tensor:
    """`bit_length` from the exponent field of the float32, read through a bitcast: x in [2^(k-1), 2^k) has biased
    exponent k - 1 + 127. Exact below 2^24."""
    exponent = (columns.float().view(torch.int32) >> 23) - 126
    return torch.where(columns > 0, exponent, 0).long()


class ColumnEngine:
    """`AfterstateEngine`'s rules on boards held as column bits: (B, W) int64, bit y = the cell y rows above the floor.

    Built for the shallow agents, which need every placement's heights, holes, rows cleared and game-over flag but
    only the chosen placement's board. A board is 10 integers, so every placement's afterstate is (B, P, W) integers
    and the whole call is ~40 small tensor operations with no scatter and no sort:

    - drop: y0 = max_j(h[c+j] - bottom[j]) as in AfterstateEngine; the piece is OR-ed in as per-column masks << y0;
    - full rows: only the piece's own rows y0 + d can fill; row d is full iff (cells of the board in that row) +
      (cells of the piece in that row, a table entry) = W;
    - clears: each full row y is cut out of every column, (col & (2^y - 1)) | ((col >> 1) & ~(2^y - 1)), the highest
      row first so the lower rows keep their index;
    - heights: the bit length of each column (`bit_length`); holes: the sum of heights minus the
      cells, which are known without a scan (before + 4 for a piece that fits - W per cleared row).

    tests/test_tetris_rules.py checks every output against AfterstateEngine on boards from random play.
    """

    def __init__(self, height: int = 20, width: int = 10, pieces=tuple(range(7)), device="cpu", num_placements=None):
        if height > 24:
            raise ValueError("ColumnEngine holds a column in the exact integer range of a float32 (height <= 24)")
        self.height, self.width, self.device = height, width, torch.device(device)
        if num_placements is None:
            num_placements = max(len(placements(p, width)) for p in pieces)
        self.num_placements = P = num_placements
        D = max(max(r for r, _ in shape) + 1 for p in pieces for shape in rotations(p))  # rows a piece spans
        self.piece_rows = D
        big = 10**6
        bottom = torch.full((7, P, width), big, dtype=torch.long)  # lowest cell per column above the box bottom
        bottom[:, :, 0] = 0  # undefined slots: never fit (box height big), change nothing
        mask = torch.zeros(7, P, width, dtype=torch.long)  # the piece's cells per column, bit d = d rows above y0
        box_height = torch.full((7, P, 1), big, dtype=torch.long)
        row_cells = torch.zeros(7, P, D, dtype=torch.long)  # the piece's cells in its row d
        valid = torch.zeros(7, P, dtype=torch.bool)
        for piece in pieces:  # only the variant's pieces: D rows may be too few for the others
            shapes = rotations(piece)
            for p, (rot, left) in enumerate(placements(piece, width)[:P]):
                shape = shapes[rot]
                h = max(r for r, _ in shape) + 1
                valid[piece, p] = True
                box_height[piece, p, 0] = h
                bottom[piece, p, 0] = big
                for r, c in shape:
                    d = h - 1 - r
                    mask[piece, p, left + c] |= 1 << d
                    bottom[piece, p, left + c] = min(int(bottom[piece, p, left + c]), d)
                    row_cells[piece, p, d] += 1
        self.valid = valid.to(self.device)
        # one gather per call: [bottom (W) | mask (W) | box height (1) | cells per piece row (D)]
        self.table = torch.cat([bottom, mask, box_height, row_cells], -1).to(self.device)
        self.rows = torch.arange(height, device=self.device)  # bit index = rows above the floor
        self.piece_row_offsets = torch.arange(D, device=self.device)

    def __call__(self, columns: torch.Tensor, pieces: torch.Tensor) -> Afterstates:
        """columns (B, W) int64, pieces (B,) long -> Afterstates whose `boards` are (B, P, W) column bits."""
        B, W = columns.shape
        H, P, D = self.height, self.num_placements, self.piece_rows
        heights = bit_length(columns)  # (B, W) column heights
        row_fill = ((columns[:, :, None] >> self.rows) & 1).sum(1)  # (B, H) cells per row, from the floor
        cells = row_fill.sum(-1, keepdim=True)  # (B, 1)
        table = self.table[pieces]  # (B, P, 2W + 1 + D)
        bottom, mask, box_height, row_cells = table.split([W, W, 1, D], -1)
        y0 = (heights[:, None, :] - bottom).amax(-1, keepdim=True)  # (B, P, 1) resting row of the box's bottom
        fits = y0 + box_height <= H
        after = columns[:, None, :] | ((mask * fits) << y0)  # (B, P, W); a piece that does not fit adds nothing
        piece_rows = y0 + self.piece_row_offsets  # (B, P, D) rows the piece spans, from the floor
        fill = row_fill.gather(1, piece_rows.clamp(max=H - 1).view(B, P * D)).view(B, P, D) + row_cells
        full = (fill == W) & fits  # (B, P, D)
        rows_cleared = full.sum(-1)  # (B, P)
        # Eagerly the clears run only when some placement clears a row (rare); under torch.compile they always run
        # (D iterations, no host sync, one graph).
        if torch.compiler.is_compiling() or bool(rows_cleared.any()):
            low = torch.where(full, (1 << piece_rows) - 1, -1)  # -1 (all bits) where row d is not full: no change
            for d in range(D - 1, -1, -1):  # the highest row first
                keep = low[..., d : d + 1]
                after = (after & keep) | ((after >> 1) & ~keep)
        new_heights = bit_length(after)  # (B, P, W)
        new_cells = cells + 4 * fits[..., 0] - W * rows_cleared
        new_holes = new_heights.sum(-1) - new_cells
        return Afterstates(after, rows_cleared, ~fits[..., 0], self.valid[pieces], new_heights, new_holes)


# ----------------------------------------------------------------------------------------------------------------------
# 4. The Gymnasium environment (its own NumPy simulation of the rules)
# ----------------------------------------------------------------------------------------------------------------------
_CELL_COLOURS = np.array([[16, 16, 24], [200, 200, 210]], dtype=np.uint8)


class PlacementSpace(gym.spaces.Discrete):
    """Discrete(34) whose `sample()` draws among the placements defined for the current piece.

    The env keeps `current_mask` up to date, so random agents (and gymnasium's env checker) only play legal indices;
    an explicit `mask=` still takes precedence.
    """

    def __init__(self, n: int = MAX_PLACEMENTS, seed=None):
        super().__init__(n, seed=seed)
        self.current_mask = np.ones(n, dtype=np.int8)

    def sample(self, mask=None, probability=None):
        if mask is None and probability is None:
            mask = self.current_mask
        return super().sample(mask=mask, probability=probability)


class TetrisEnv(gym.Env):
    """Placement-level Tetris. Observation Dict(board=(H, W) uint8 0/1, row 0 at the top; piece=Discrete(7)).

    Action: a placement index in Discrete(34); `info["action_mask"]` marks the indices defined for the current piece
    and any other index raises ValueError. Reward: rows cleared. `terminated`: the chosen placement does not fit
    inside the board (the board is then left unchanged). There is no time limit.
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(self, variant: str = "sz", render_mode: str | None = None, height=None, width=None, pieces=None):
        if variant not in VARIANTS:
            raise ValueError(f"unknown Tetris variant {variant!r}; choose one of {sorted(VARIANTS)}")
        h, w, p = VARIANTS[variant]
        self.height, self.width = height or h, width or w
        self.pieces = tuple(pieces) if pieces is not None else p
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Dict(
            {
                "board": gym.spaces.Box(0, 1, (self.height, self.width), dtype=np.uint8),
                "piece": gym.spaces.Discrete(7),
            }
        )
        self.action_space = PlacementSpace(MAX_PLACEMENTS)
        # piece -> list of (cells as (row, col) top-down, width) per placement index
        self._table = {}
        for piece in range(7):
            shapes = rotations(piece)
            self._table[piece] = [(shapes[rot], col) for rot, col in placements(piece, self.width)]
        self.board = np.zeros((self.height, self.width), dtype=np.uint8)
        self.piece = self.pieces[0]
        self.lines = 0

    def _obs(self):
        return {"board": self.board.copy(), "piece": self.piece}

    def _info(self):
        mask = action_mask(self.piece, self.width)
        self.action_space.current_mask = mask
        return {"action_mask": mask, "lines": self.lines}

    def _draw_piece(self):
        self.piece = int(self.pieces[self.np_random.integers(len(self.pieces))])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.board = np.zeros((self.height, self.width), dtype=np.uint8)
        self.lines = 0
        self._draw_piece()
        return self._obs(), self._info()

    def step(self, action):
        table = self._table[self.piece]
        action = int(action)
        if not 0 <= action < len(table):
            raise ValueError(
                f"placement {action} is not defined for piece {PIECE_NAMES[self.piece]} "
                f"(valid: 0..{len(table) - 1}; see info['action_mask'])"
            )
        shape, col = table[action]
        # Drop from above the board one row at a time until the next row down would collide or leave the board.
        top = -(max(r for r, _ in shape) + 1)
        while all(
            r + top + 1 < self.height and (r + top + 1 < 0 or not self.board[r + top + 1, c + col]) for r, c in shape
        ):
            top += 1
        if any(r + top < 0 for r, _ in shape):
            return self._obs(), 0.0, True, False, self._info()
        for r, c in shape:
            self.board[r + top, c + col] = 1
        full = self.board.all(1)
        cleared = int(full.sum())
        if cleared:
            kept = self.board[~full]
            self.board = np.vstack([np.zeros((cleared, self.width), dtype=np.uint8), kept])
        self.lines += cleared
        self._draw_piece()
        return self._obs(), float(cleared), False, False, self._info()

    def render(self):
        if self.render_mode == "ansi":
            rows = ["|" + "".join("#" if v else "." for v in row) + "|" for row in self.board]
            footer = "+" + "-" * self.width + "+"
            return "\n".join([f"next: {PIECE_NAMES[self.piece]}  lines: {self.lines}", *rows, footer]) + "\n"
        if self.render_mode == "rgb_array":
            return render_board(self.board)
        return None


def render_board(board: np.ndarray, scale: int = 16) -> np.ndarray:
    """(H, W) 0/1 board, row 0 at the top -> (H scale, W scale, 3) uint8 RGB image with grid lines (the env's
    rgb_array frame; td_lambda_tetris's --capture-video draws its batched boards with it)."""
    img = _CELL_COLOURS[np.asarray(board, dtype=np.uint8)].repeat(scale, 0).repeat(scale, 1)
    img[::scale, :] = 60  # grid lines
    img[:, ::scale] = 60
    return img


class TetrisVideo:
    """Batched games as mp4 (td_lambda_tetris.py --capture-video): the boards of the recorded runs (run index -> file
    tag), one frame per placement, for the episodes of gymnasium's capped cubic schedule, numbered by the run's episode
    counter (a resumed run goes on from it); at most 2,000 frames per video (a late 10x10 game: ~10k placements)."""

    def __init__(self, folder: str, runs: dict[int, str], episodes: torch.Tensor, height: int, columns: bool):
        if runs:  # no runs: records nothing, writes nothing
            os.makedirs(folder, exist_ok=True)
        self.folder, self.runs, self.height, self.columns = folder, runs, height, columns
        self.episode, self.frames = {r: int(episodes[r]) for r in runs}, {r: [] for r in runs}

    @staticmethod
    def wanted(episode: int) -> bool:
        return round(episode ** (1 / 3)) ** 3 == episode if episode < 1000 else episode % 1000 == 0

    def add(self, boards: torch.Tensor, episodes: torch.Tensor, active: torch.Tensor):
        """After every step: the boards s_t ((R, W) column bits or (R, H, W)); a game that just ended has already been
        replaced by the next one's empty board, that game's first frame. Boards are copied only while recording."""
        if not self.runs:
            return
        ids, recording = list(self.runs), []
        for r, count, learning in zip(ids, episodes[ids].tolist(), active[ids].tolist(), strict=True):
            if count != self.episode[r]:
                self.write(r)
                self.episode[r] = count
            if learning and self.wanted(self.episode[r]) and len(self.frames[r]) < 2000:
                recording.append(r)
        if recording:
            now = boards[recording]
            now = (columns_to_boards(now, self.height) if self.columns else now).cpu().numpy()
            for r, board in zip(recording, now, strict=True):
                self.frames[r].append(board)

    def write(self, r: int):
        if self.frames[r]:
            from moviepy import ImageSequenceClip

            clip = ImageSequenceClip([render_board(b) for b in self.frames[r]], fps=10)
            clip.write_videofile(
                os.path.join(self.folder, f"{self.runs[r]}-episode-{self.episode[r]}.mp4"), logger=None
            )
        self.frames[r] = []

    def close(self):
        for r in self.runs:
            self.write(r)


gym.register("envs/SZTetris-v0", entry_point=TetrisEnv, kwargs={"variant": "sz"})
gym.register("envs/Tetris-v0", entry_point=TetrisEnv, kwargs={"variant": "tetris"})
gym.register("envs/Tetris10x10-v0", entry_point=TetrisEnv, kwargs={"variant": "tetris10x10"})

ENV_VARIANTS = {"envs/SZTetris-v0": "sz", "envs/Tetris-v0": "tetris", "envs/Tetris10x10-v0": "tetris10x10"}


# ----------------------------------------------------------------------------------------------------------------------
# Speed benchmark: python -m envs --benchmark-seconds 10
# ----------------------------------------------------------------------------------------------------------------------
def benchmark(seconds: float, variant: str = "sz", batches=(1, 32, 256)) -> dict:
    """Placements per second of (a) the Gymnasium env with random legal placements and (b) the batched engine
    enumerating every placement's afterstate for B boards of random legal play (one call = B placements decided)."""
    import time

    results = {}
    env = TetrisEnv(variant)
    env.reset(seed=0)
    env.action_space.seed(0)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        _, _, terminated, _, _ = env.step(env.action_space.sample())
        steps += 1
        if terminated:
            env.reset()
    results["gymnasium env, random placements"] = steps / (time.perf_counter() - t0)
    height, width, pieces = VARIANTS[variant]
    engine = AfterstateEngine(height, width, pieces)
    gen = torch.Generator().manual_seed(0)
    piece_ids = torch.tensor(pieces)
    for batch in batches:
        boards = torch.zeros(batch, height, width, dtype=torch.uint8)
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / len(batches):
            cur = piece_ids[torch.randint(len(pieces), (batch,), generator=gen)]
            after = engine(boards, cur)
            score = torch.rand(batch, engine.num_placements, generator=gen).masked_fill(
                ~after.valid | after.game_over, -1
            )
            action = score.argmax(-1)
            over = after.game_over[torch.arange(batch), action]
            boards = torch.where(over[:, None, None], 0, after.boards[torch.arange(batch), action])
            calls += 1
        results[f"batched engine, B={batch}"] = calls * batch / (time.perf_counter() - t0)
    return results
