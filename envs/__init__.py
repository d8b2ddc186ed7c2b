"""Shared Tetris module; importing it registers envs/SZTetris-v0, envs/Tetris-v0 and envs/Tetris10x10-v0."""

from envs import tetris  # noqa: F401  (registers the Gymnasium ids)
