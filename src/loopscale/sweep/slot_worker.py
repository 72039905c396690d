"""A CPU slot's worker: one long-lived process that trains the runs its sweep hands it, one at a time.

``python -m loopscale.sweep.slot_worker SWEEP_DIR MAX_RETRIES`` reads run ids from stdin (one run, or the
tab-separated runs of one pack, a line), trains them through ``execute_pack`` (``execute_run``'s lock, attempts
and failure records for each run) with its output in ``runs/<first id>/worker.log``, and answers one line of
``<id>=<outcome>`` per line on stdout. It starts
torch once for all its runs: a fresh process per run would pay the import of torch (and of
torch._dynamo, which the optimisers load) again each time, seconds per run on a small CPU.
End of stdin ends it; SIGTERM inside a run checkpoints first (the trainer's signal path), then it exits.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (fds 1 and 2, so C-level output too) appended to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def serve(sweep_dir: str, max_retries: int) -> None:
    """Train each run id read from stdin; report its outcome on the (private) control channel."""
    control = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints between runs must not reach the control channel
    from loopscale.signals import worker_process
    from loopscale.sweep.attempt import execute_pack
    from loopscale.sweep.store import open_store
    from loopscale.train import RunInterrupted

    store = open_store(sweep_dir)
    for line in sys.stdin:
        run_ids = [r for r in line.strip().split("\t") if r]
        if not run_ids:
            continue
        store.run_dir(run_ids[0]).mkdir(parents=True, exist_ok=True)
        try:
            with output_to(store.run_dir(run_ids[0]) / "worker.log"), worker_process():
                outcomes = execute_pack(store, run_ids, max_retries=max_retries, executor="local-worker")
        except RunInterrupted as e:  # checkpointed; the sweep reads the runs' states
            sys.exit(e.exit_code)
        control.write("\t".join(f"{rid}={outcomes.get(rid, '?')}" for rid in run_ids) + "\n")


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
