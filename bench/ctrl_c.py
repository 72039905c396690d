"""bench: how fast Ctrl-C ends each command that computes for a while, and what it leaves behind (issue 40).

    python bench/ctrl_c.py                      # ~3 minutes on 2 cores
    python bench/ctrl_c.py --src /tmp/before    # another checkout's src/ (git worktree add /tmp/before REV)
    python bench/ctrl_c.py --only design --wait 90

Each case starts ``python -m loopscale ...`` in a session of its own, waits until it computes (design: its 2
workers exist; fit: the line before fitting; eval: the line before scoring; sweep run: both CPU slots have
trained a step) and 2 s more, then sends the signal to the parent alone (``kill -INT PID``) or to its process
group (what a terminal's Ctrl-C does), and measures the seconds until the parent has exited *and* both of its
pipes are at end of file (a caller reading them waits that long), the exit status, and the live processes of
the session left one second later. A case that has not ended after ``--wait`` seconds is reported as such and killed.
tests/test_ctrl_c_processes.py asserts the same things without timing them.
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _stat(pid: str) -> list[str]:
    with open(f"/proc/{pid}/stat") as fh:
        text = fh.read()
    return text[text.rfind(")") + 2 :].split()


def _procs() -> list[tuple[int, list[str]]]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                out.append((int(name), _stat(name)))
            except OSError:
                continue
    return out


def children(pid: int) -> int:
    return sum(int(st[1]) == pid and st[0] != "Z" for _p, st in _procs())


def session(sid: int) -> list[int]:
    return [p for p, st in _procs() if int(st[3]) == sid and st[0] != "Z"]


class Case:
    """A command line, what "computing" means for it, and the test of that: ``marker(proc, stderr so far)``."""

    def __init__(self, name: str, argv: list[str], ready: str, marker: Callable[[subprocess.Popen, str], bool]) -> None:
        self.name, self.argv, self.ready, self.marker = name, argv, ready, marker


def run_case(case: Case, to: str, signum: int, env: dict[str, str], wait: float) -> str:
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopscale", *case.argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    for f in (proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    err = b""
    open_pipes = 2

    def pump(timeout: float) -> None:
        nonlocal err, open_pipes
        for key, _ in sel.select(timeout):
            data = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
            if not data:
                sel.unregister(key.fileobj)
                open_pipes -= 1
            elif key.fileobj is proc.stderr:
                err += data

    t0 = time.time()
    while not case.marker(proc, err.decode(errors="replace")):
        pump(0.05)
        if proc.poll() is not None or time.time() - t0 > 300:
            return f"never ready ({case.ready}); exit {proc.poll()}: {err.decode(errors='replace')[-300:]}"
    time.sleep(2)  # computing (design: its workers inside their first simulations)
    ts = time.time()
    (os.killpg if to == "group" else os.kill)(proc.pid, signum)
    while (proc.poll() is None or open_pipes) and time.time() - ts < wait:
        pump(0.05)
    took = time.time() - ts
    if proc.poll() is None or open_pipes:
        left = session(proc.pid)
        for p in left:
            os.kill(p, signal.SIGKILL)
        proc.wait()
        state = "parent running" if proc.returncode == -signal.SIGKILL else f"exit {proc.returncode}, pipes held"
        return f"not ended after {wait:.0f} s ({state}; {len(left)} live processes, killed)"
    time.sleep(1)
    left = session(proc.pid)
    for p in left:
        os.kill(p, signal.SIGKILL)
    return f"exit {proc.returncode} in {took:.2f} s, {len(left)} live process(es) left"


def setup(work: Path) -> dict[str, Callable[[str], Case]]:
    sys.path.insert(0, str(HERE.parent / "tests"))
    import numpy as np
    import tomli_w

    from conftest import TINY_DATA, TINY_MODEL, tiny_sweep_spec
    from loopscale.train import load_train_config, train

    rng = np.random.default_rng(0)
    rows = []
    for c in (1e13, 3e13, 1e14):
        for r in (1, 2, 4):
            for n in (3e4, 6e4, 1.2e5):
                d = c / (6 * n * (1 + r))
                loss = 2 + 40 * (n + r**0.5 * n) ** -0.3 + 300 * d**-0.3 + rng.normal(0, 0.003)
                rows.append(f"{r},{n},{n},{d},{loss},{c},ok\n")
    csv = work / "runs.csv"
    csv.write_text("r,N_once,N_rec,D,val_loss,C,status\n" + "".join(rows) + "2,1e5,1e5,1e7,9.9,1e13,failed\n")
    over = [f"model.{k}={v}" for k, v in {**TINY_MODEL, "r": 2}.items()]
    over += [f"data.real_text_bytes={TINY_DATA['real_text_bytes']}"]
    over += [f"data.world.{k}={v}" for k, v in TINY_DATA["world"].items()]
    over += [
        "run.steps=5",
        "run.batch_size=8",
        "run.threads=1",
        "run.val_tokens=4096",
        "run.min_steps=5",
        "optim.transfer=false",
    ]
    run = work / "run"
    train(load_train_config(None, over), run, progress=False)
    spec = tiny_sweep_spec({"log_every": 1, "ckpt_every": 0}, budgets=[2e11], widths={"2e11": [16, 32]})
    (work / "long.toml").write_text(tomli_w.dumps(spec))

    def sweep(tag: str) -> Case:  # a fresh sweep dir per case; ready when both slots have a metrics line
        root = work / f"sweep-{tag}"
        argv = ["sweep", "run", str(work / "long.toml"), "--out", str(root), "--no-progress", "--slots", "2"]
        return Case(
            "sweep run",
            argv,
            "both slots trained a step",
            lambda p, e: len(list(root.glob("runs/*/metrics.jsonl"))) == 2,
        )

    design = [
        "design",
        "quick",
        "--sims",
        "400",
        "--no-search",
        "--workers",
        "2",
        "--bootstrap",
        "4",
        "--restarts",
        "20",
    ]
    return {
        "design": lambda tag: Case("design", design, "2 workers", lambda p, e: children(p.pid) == 2),
        "fit": lambda tag: Case(
            "fit",
            ["fit", str(csv), "-o", str(work / "fit.json"), "--bootstrap", "100000", "--restarts", "20"],
            "fitting",
            lambda p, e: "excluded 1 run" in e,
        ),
        "eval": lambda tag: Case(
            "eval",
            ["eval", str(run), "--force", "--r", "1,2,4,8", "-o", str(work / "axes")],
            "scoring",
            lambda p, e: "scoring" in e,
        ),
        "sweep": sweep,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, help="a checkout whose src/ the commands run (default: this one)")
    ap.add_argument("--only", action="append", choices=["design", "fit", "eval", "sweep"])
    ap.add_argument("--wait", type=float, default=60, help="seconds before a case counts as hung")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.src is not None:
        env["PYTHONPATH"] = str(args.src.resolve() / "src")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env.setdefault("LOOPSCALE_CACHE", str(work / "cache"))
        os.environ["LOOPSCALE_CACHE"] = env["LOOPSCALE_CACHE"]
        cases = setup(work)
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; src {args.src or HERE.parent}")
        plan = [("parent", signal.SIGINT), ("group", signal.SIGINT), ("parent", signal.SIGKILL)]
        for key in args.only or list(cases):
            for to, signum in plan:
                if signum == signal.SIGKILL and key != "design":
                    continue
                case = cases[key](f"{to}-{int(signum)}")
                what = f"{case.name}: {signal.Signals(signum).name} to the {to}"
                print(f"{what:<44} {run_case(case, to, signum, env, args.wait)}", flush=True)


if __name__ == "__main__":
    main()
