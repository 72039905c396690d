import os
import sys

# Bytecode is written here even where the environment says not to (PYTHONDONTWRITEBYTECODE): the suite starts
# many Python processes (workers, CLIs, slot workers, ranks), and the test command installs with --no-compile
# (pip's serial byte-compile of torch, transformers and the rest was 66 of the install's 126 s; docs/testing.md,
# "What CI costs"), so each module is compiled once, on its first import, by whichever process gets there
# first. Set before pytest-xdist starts its workers (this file is loaded first), so they and their children
# inherit it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny test models run fastest (and most robustly on a busy machine) on one intra-op thread.
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests never write into the user's cache; packed token rows and the compiled CPU kernels are shared
    within a session. Under ``pytest -n 2`` each worker has its own base temp dir, so its own cache."""
    os.environ["LOOPSCALE_CACHE"] = str(tmp_path_factory.mktemp("loopscale-cache"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests (marked ``long``) first, in their usual order: under ``pytest -n 2`` a worker that
    took one of them last would run alone while the other waits."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


# A small embedded-default data config: real text capped, a small world (fast to build and pack).
TINY_DATA = {"real_text_bytes": 400_000, "world": {"n_entities": 60, "n_unseen_entities": 20, "eval_per_task": 20}}
TINY_MODEL = {"d_model": 32, "head_dim": 16, "L_eff": 6, "n_prelude": 1, "n_coda": 1, "seq_len": 64, "vocab_size": 257}


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


OK_RESULT = {"status": "ok", "val_loss": 3.0, "r": 2, "N_once": 1, "N_rec": 1, "D": 1}
"""The least result.json a sweep counts as done (``store.result_problem``): stand-in workers write it."""


def tiny_sweep_spec(run: dict | None = None, **sweep) -> dict:
    """2 budgets x 2 r x 2 widths of a 1 + 4 + 1 model at T = 64: 6-36 steps per run."""
    import copy

    model = {k: v for k, v in TINY_MODEL.items() if k != "d_model"}
    return {
        "sweep": {
            "name": "tiny",
            "budgets": [2e9, 4e9],
            "r": [1, 2],
            "widths": {"2e9": [16, 32], "4e9": [16, 32]},
            "max_retries": 1,
            **sweep,
        },
        "train": {
            "model": model,
            "data": copy.deepcopy(TINY_DATA),
            "optim": {"transfer": False},
            "run": {"batch_size": 8, "threads": 1, "val_tokens": 4096, "min_steps": 5, "log_every": 10, **(run or {})},
        },
    }


def free_port() -> int:
    """A free TCP port on localhost (for a process group's rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(worker, world: int, out) -> None:  # type: ignore[no-untyped-def]
    """Run ``worker(rank, world, port, out)`` in ``world`` processes (gloo ranks; the worker joins the group)."""
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(world, free_port(), str(out)), nprocs=world, join=True)
