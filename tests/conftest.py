import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "algos"))
sys.path.insert(0, os.path.join(ROOT, "benchmark"))


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Every test's small ops on one torch thread: on two, every op waits for the other thread, and a test ran ~40x
    slower while the other core was busy. The count is restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
