"""Shared modules of the scripts: tetris.py (registers envs/SZTetris-v0, envs/Tetris-v0 and envs/Tetris10x10-v0) and
atari.py (the Atari protocol of the MoE scripts).
`code_version()` is what every script's summary.json records of the code that ran it; `damaged_member()` is how every
script and tool checks a checkpoint, snapshot or pack before loading it."""

import os
import subprocess
import zipfile

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


def damaged_member(path: str) -> str | None:
    """The first member of a zip-format file (a torch checkpoint or snapshot, an .npz) whose data does not match the
    CRC-32 stored for it, or None. torch.load never checks these records (a flipped byte loads as a wrong weight) and
    np.load checks a member only when it reads it, so every loader calls this first. A file that is not a zip at all
    (empty, truncated before its directory, random bytes) is also None: the loader's own error names it."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return None


def exit_if_damaged(path: str, label: str = ""):
    """For the tools: SystemExit with one line naming the file and the fix when damaged_member finds a member."""
    if member := damaged_member(path):
        raise SystemExit(
            f"error: {label}{path!r} is damaged ({member} fails its CRC-32 check); restore it from a copy "
            "(a committed file: git checkout -- <file>) or write it again"
        )
