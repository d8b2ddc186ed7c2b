"""Shared modules of the scripts: tetris.py (registers envs/SZTetris-v0, envs/Tetris-v0 and envs/Tetris10x10-v0) and
atari.py (the Atari protocol of the MoE scripts).
`code_version()` is what every script's summary.json records of the code that ran it."""

import os
import subprocess

from envs import tetris  # noqa: F401  (registers the Gymnasium ids)


def code_version() -> dict:
    """The git commit of the checkout the scripts run from, and the tracked files under algos/ and envs/ that differ
    from it (empty: the code is the commit's). commit is None outside a git checkout (a copied script)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*cmd: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", root, *cmd], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return None

    commit = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no", "--", "algos", "envs") or ""
    return {"commit": commit.strip() if commit else None, "uncommitted": [line[3:] for line in changed.splitlines()]}
