import os

import pytest
import torch

# Two cores on CI: one intra-op thread per core, no oversubscription.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
