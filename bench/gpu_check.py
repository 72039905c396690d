"""The one prepared GPU check: speed, memory, a real training run, DDP and a sweep, in under 10 minutes.

    python bench/gpu_check.py --out DIR            # on a CUDA machine (bench/gpu_check.sh wraps it)
    python bench/gpu_check.py --out DIR --smoke    # the same sections at toy sizes on CPU (tests run this)

Sections, in order of value, each timed against ``--budget-s`` and recorded even when it fails (its
error), so one broken part never loses the others:

1. ``steps``: paper-grid models (arXiv 2604.21106 §4: L_eff 20, head_dim 128, T 2048, V 32001; r = 1 as
   the 0 + 20 + 0 loop) at s = 10 and s = 20 for r = 1, 2, 4, 8: a full training step (forward, backward,
   MuonH + AdamW) in bf16, eager and whole-model compiled: tokens/s, MFU against the device's dense bf16
   peak, measured peak memory beside loopscale.memory's prediction for the same micro-batch.
2. ``packs``: k small runs as one pack (``loopscale.train.pack``; the sweep's default for same-shaped runs) on one
   device, k = 1, 4, 16 at d = 64 and 256 (L_eff 12 as 2 + 2 x 4 + 2, head_dim 64, T 256, 32 rows per member,
   the byte vocabulary 257, bf16): tokens/s of all members together beside one solo run's, measured peak memory
   beside ``loopscale.memory``'s prediction for the pack (k members' peaks side by side).
3. ``train``: ``loopscale train`` of a paper-grid model (s = 10, r = 4, 32 rows of 2048 per step) for 300
   steps on the embedded data: its loss curve, tokens/s, MFU, final validation loss.
4. ``ddp``: ``torchrun`` over every visible GPU (one GPU: a world of one), 30 steps.
5. ``sweep``: a tiny sweep through the local executor with one GPU slot per device.

Writes ``gpu_check.json`` (everything) and ``gpu_check.md`` (the tables) to ``--out`` after every section.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from loopscale import accounting, memory  # noqa: E402
from loopscale.config import ModelConfig  # noqa: E402
from loopscale.model import LoopedLM  # noqa: E402
from loopscale.optim import OptimConfig, build_optimizers  # noqa: E402
from loopscale.train.compiling import compile_for_training  # noqa: E402
from loopscale.train.hardware import autocast, peak_flops, versions  # noqa: E402


# ---- shapes -----------------------------------------------------------------------------------
def paper_model(s: int, r: int, smoke: bool) -> ModelConfig:
    layout: dict[str, Any] = {"n_prelude": 2, "n_coda": 2, "injection": "linear"}
    if r == 1:
        layout = {"n_prelude": 0, "n_coda": 0, "injection": "passthrough", "r1_looped": True}
    if smoke:  # same layouts, toy sizes
        return ModelConfig(d_model=16 * s, head_dim=16, L_eff=20, r=r, vocab_size=300, seq_len=64, **layout)
    return ModelConfig(s=s, head_dim=128, L_eff=20, r=r, vocab_size=32001, seq_len=2048, **layout)


class Clock:
    """The run's time budget: sections and measurements ask before they start."""

    def __init__(self, budget_s: float) -> None:
        self.t0, self.budget = time.time(), budget_s

    def left(self) -> float:
        return self.budget - (time.time() - self.t0)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- 1. steps ---------------------------------------------------------------------------------
def measure_step(
    cfg: ModelConfig, rows: int, mode: str, device: torch.device, dtype: str, steps: int
) -> dict[str, Any]:
    """One configuration: warm-up (compilation), then ``steps`` timed training steps of ``rows`` rows."""
    torch.manual_seed(0)
    model = LoopedLM(cfg).to(device)
    opt = build_optimizers(
        model.param_groups(),
        OptimConfig(),
        d_model=cfg.width,
        tokens_per_step=rows * cfg.seq_len,
        total_tokens=1e12,
        r=cfg.r,
    )
    step_fn, _ = compile_for_training(
        model, model.blocks(), mode, device, warn=lambda m: print(f"  warning: {m}", flush=True)
    )
    x = torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len + 1), device=device)

    def step() -> float:
        with autocast(device, dtype):
            loss = step_fn(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    t = time.time()
    first_loss = step()
    sync(device)
    warmup_s = time.time() - t
    step()  # the second step after a compile can still build (autotuning, the optimiser's first state)
    times = []
    for _ in range(steps):
        sync(device)
        t = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t)
    sec = statistics.median(times)
    tokens = rows * cfg.seq_len
    f = accounting.train_flops_per_token(cfg)
    peak = peak_flops(device, dtype)
    rg = memory.regime(device.type, dtype)
    predicted = memory.train_peak(cfg, rows, rg).total
    out: dict[str, Any] = {
        "d_model": cfg.width,
        "r": cfg.r,
        "mode": getattr(step_fn, "mode", mode),
        "rows": rows,
        "tokens_per_s": tokens / sec,
        "ms_per_step": 1e3 * sec,
        "warmup_s": warmup_s,
        "flops_per_token": f,
        "mfu": (tokens / sec * f / peak) if peak else None,
        "first_loss": first_loss,
        "predicted_peak_bytes": predicted,
    }
    if device.type == "cuda":
        out["measured_peak_bytes"] = int(torch.cuda.max_memory_allocated(device))
        out["measured_over_predicted"] = out["measured_peak_bytes"] / predicted
    return out


def section_steps(args: argparse.Namespace, clock: Clock, device: torch.device) -> list[dict[str, Any]]:
    dtype = "float32" if args.smoke else "bfloat16"
    rows = 2 if args.smoke else args.rows
    plan = [(s, r, "off") for s in args.s for r in (1, 2, 4, 8)]
    if not args.no_compile:  # compiled: the largest width first (the MFU goal), then the smaller
        plan += [(s, r, "model") for s in sorted(args.s, reverse=True) for r in (4, 1)]
    results = []
    for s, r, mode in plan:
        need = 20 if mode == "off" else 120
        if clock.left() < need + args.reserve_s:
            results.append({"s": s, "r": r, "mode": mode, "skipped": "time budget"})
            continue
        print(f"steps: s={s} r={r} {mode}", flush=True)
        try:
            res = {
                "s": s,
                **measure_step(paper_model(s, r, args.smoke), rows, mode, device, dtype, 3 if args.smoke else 10),
            }
        except Exception as e:
            res = {
                "s": s,
                "r": r,
                "mode": mode,
                "error": f"{type(e).__name__}: {e}"[:500],
                "traceback": traceback.format_exc()[-2000:],
            }
        print(f"  {json.dumps({k: v for k, v in res.items() if k != 'traceback'})[:300]}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the last configuration's model and optimiser are gone
        results.append(res)
    return results


# ---- 2. packs -----------------------------------------------------------------------------------------
def pack_model(d: int, smoke: bool) -> ModelConfig:
    """A small study's run (the CPU presets' shape at GPU widths): L_eff 12 as 2 + 2 x 4 + 2, byte vocabulary."""
    if smoke:
        return ModelConfig(d_model=d, head_dim=16, L_eff=12, r=4, vocab_size=257, seq_len=32)
    return ModelConfig(d_model=d, head_dim=64, L_eff=12, r=4, vocab_size=257, seq_len=256)


def measure_pack(
    cfg: ModelConfig, k: int, rows: int, device: torch.device, dtype: str, steps: int, solo: bool = False
) -> dict[str, Any]:
    """``k`` members of ``cfg`` as one pack (or, ``solo``, one plain run): the median step over ``steps``."""
    from loopscale.model.packed import PackedLM
    from loopscale.optim.packed import PackedOptimizers

    models, opts = [], []
    for seed in range(k):
        torch.manual_seed(seed)
        model = LoopedLM(cfg).to(device)
        models.append(model)
        opts.append(
            build_optimizers(
                model.param_groups(),
                OptimConfig(),
                d_model=cfg.width,
                tokens_per_step=rows * cfg.seq_len,
                total_tokens=1e9,
                r=cfg.r,
            )
        )
    x = torch.randint(0, cfg.vocab_size, (k, rows, cfg.seq_len + 1), device=device)
    if solo:
        model, opt = models[0], opts[0]

        def step() -> None:
            with autocast(device, dtype):
                loss = model(x[0, :, :-1], x[0, :, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    else:
        pack = PackedLM(models)
        popt = PackedOptimizers(pack.stacked(), opts, [{id(p): n for n, p in m.named_parameters()} for m in models])

        def step() -> None:
            with autocast(device, dtype):
                losses = pack(x[:, :, :-1], x[:, :, 1:])
            losses.sum().backward()
            popt.step()
            popt.zero_grad()

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    step()
    step()
    times = []
    for _ in range(steps):
        sync(device)
        t = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t)
    sec = statistics.median(times)
    members = 1 if solo else k
    rg = memory.regime(device.type, dtype)
    out: dict[str, Any] = {
        "d_model": cfg.width,
        "k": members,
        "mode": "solo" if solo else "pack",
        "rows": rows,
        "tokens_per_s": members * rows * cfg.seq_len / sec,
        "ms_per_step": 1e3 * sec,
        "predicted_peak_bytes": members * memory.train_peak(cfg, rows, rg).total,
    }
    if device.type == "cuda":
        out["measured_peak_bytes"] = int(torch.cuda.max_memory_allocated(device))
        out["measured_over_predicted"] = out["measured_peak_bytes"] / out["predicted_peak_bytes"]
    return out


def section_packs(args: argparse.Namespace, clock: Clock, device: torch.device) -> list[dict[str, Any]]:
    dtype = "float32" if args.smoke else "bfloat16"
    widths, ks, rows = ((16, 32), (1, 2), 2) if args.smoke else ((64, 256), (1, 4, 16), 32)
    plan = [(d, 1, True) for d in widths] + [(d, k, False) for d in widths for k in ks]
    results: list[dict[str, Any]] = []
    for d, k, solo in plan:
        if clock.left() < 15 + args.reserve_s:
            results.append({"d_model": d, "k": k, "mode": "solo" if solo else "pack", "skipped": "time budget"})
            continue
        print(f"packs: d={d} k={k} {'solo' if solo else 'pack'}", flush=True)
        try:
            res: dict[str, Any] = measure_pack(
                pack_model(d, args.smoke), k, rows, device, dtype, 3 if args.smoke else 10, solo
            )
        except Exception as e:
            res = {"d_model": d, "k": k, "error": f"{type(e).__name__}: {e}"[:500], "traceback": traceback.format_exc()}
        print(f"  {json.dumps({key: v for key, v in res.items() if key != 'traceback'})[:300]}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        results.append(res)
    solo_tps = {m["d_model"]: m["tokens_per_s"] for m in results if m.get("mode") == "solo" and "tokens_per_s" in m}
    for m in results:
        if m.get("mode") == "pack" and m.get("d_model") in solo_tps and "tokens_per_s" in m:
            m["vs_solo"] = m["tokens_per_s"] / solo_tps[m["d_model"]]
    return results


# ---- 3-5. the CLI: train, torchrun, sweep ------------------------------------------------------------
def _toml(d: dict[str, Any]) -> str:
    import tomli_w

    return tomli_w.dumps(d)


def _model_table(s: int, r: int, smoke: bool) -> dict[str, Any]:
    cfg = paper_model(s, r, smoke)
    keep = ("d_model", "head_dim", "L_eff", "n_prelude", "n_coda", "r", "seq_len", "vocab_size", "injection")
    return {k: v for k, v in cfg.model_dump(mode="json").items() if k in keep}


def _pythonpath() -> str:
    """This checkout's src first (the device tool's copy has no install), then what the caller set."""
    return os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)


def _cli(argv: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    t = time.time()
    rc: int | str
    with log.open("w") as fh:
        try:
            proc = subprocess.run(
                argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=max(10.0, timeout),
                env={**os.environ, "PYTHONPATH": _pythonpath(), **(env or {})},
            )
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return {"rc": rc, "wall_s": time.time() - t, "log_tail": log.read_text(errors="replace")[-1500:]}


def _run_summary(run_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    res = run_dir / "result.json"
    if res.exists():
        r = json.loads(res.read_text())
        out.update(
            {
                k: r.get(k)
                for k in (
                    "status",
                    "val_loss",
                    "train_loss",
                    "steps",
                    "wall_s",
                    "world_size",
                    "micro_batch",
                    "predicted_peak_bytes",
                    "measured_peak_bytes",
                    "compile",
                    "error",
                )
            }
        )
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        logs = [m for m in recs if "train_loss" in m]
        out["loss_curve"] = [[m["step"], round(m["train_loss"], 4)] for m in logs]
        late = [m for m in logs[len(logs) // 2 :] if m.get("tokens_per_s")]
        if late:
            out["tokens_per_s"] = statistics.median(m["tokens_per_s"] for m in late)
            out["mfu"] = statistics.median(m["mfu"] for m in late) if all("mfu" in m for m in late) else None
    return out


# toy runs (smoke, the sweep) read a small slice of the embedded default: quick to pack
TOY_DATA = {
    "allow_default": True,
    "real_text_bytes": 400_000,
    "world": {"n_entities": 60, "n_unseen_entities": 20, "eval_per_task": 20},
}


def train_config(args: argparse.Namespace, steps: int, batch: int) -> dict[str, Any]:
    return {
        "model": _model_table(args.train_s, 4, args.smoke),
        "data": TOY_DATA if args.smoke else {"allow_default": True},
        "run": {
            "steps": steps,
            "batch_size": batch,
            "micro_batch": "auto",
            "log_every": 10,
            "val_tokens": 4096 if args.smoke else 2**20,
            "ckpt_every": 0,
            "min_steps": 1,
            "device": "cpu" if args.smoke else "cuda",
        },
    }


def section_train(args: argparse.Namespace, clock: Clock, work: Path) -> dict[str, Any]:
    steps, batch = (20, 4) if args.smoke else (300, 32)
    cfg = work / "train.toml"
    cfg.write_text(_toml(train_config(args, steps, batch)))
    run_dir = work / "train-run"
    res = _cli(
        [sys.executable, "-m", "loopscale", "train", str(cfg), "--out", str(run_dir), "--no-progress"],
        work / "train.log",
        clock.left() - args.reserve_s,
    )
    return {**res, "steps": steps, "rows_per_step": batch, **_run_summary(run_dir)}


def section_ddp(args: argparse.Namespace, clock: Clock, work: Path) -> dict[str, Any]:
    n = 2 if args.smoke else max(1, torch.cuda.device_count())
    cfg = work / "ddp.toml"
    conf = train_config(args, 10 if args.smoke else 30, 4 * n if args.smoke else 16 * n)
    cfg.write_text(_toml(conf))
    run_dir = work / "ddp-run"
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={n}",
        "-m",
        "loopscale",
        "train",
        str(cfg),
        "--out",
        str(run_dir),
        "--no-progress",
    ]
    env = {"OMP_NUM_THREADS": "1"} if args.smoke else {}
    res = _cli(argv, work / "ddp.log", clock.left() - args.reserve_s, env)
    return {**res, "nproc": n, **_run_summary(run_dir)}


def section_sweep(args: argparse.Namespace, clock: Clock, work: Path) -> dict[str, Any]:
    model = {k: v for k, v in _model_table(args.train_s, 2, True).items() if k not in ("d_model", "r")}
    budgets = [1e10, 2e10]  # toy models on either device: 12-45 steps a run
    spec = {
        "sweep": {
            "name": "gpu-check",
            "budgets": budgets,
            "r": [1, 2],
            "widths": {str(b): [16, 32] for b in budgets},
            "max_retries": 0,
        },
        "train": {
            "model": model,
            "data": TOY_DATA,
            "optim": {"transfer": False},
            "run": {
                "batch_size": 8,
                "val_tokens": 4096,
                "min_steps": 5,
                "log_every": 10,
                "device": "cpu" if args.smoke else "cuda",
            },
        },
    }
    path = work / "sweep.toml"
    path.write_text(_toml(spec))
    out = work / "sweep"
    res = _cli(
        [sys.executable, "-m", "loopscale", "sweep", "run", str(path), "--out", str(out), "--no-progress"],
        work / "sweep.log",
        clock.left() - args.reserve_s,
    )
    runs = []
    for result in sorted((out / "runs").glob("*/result.json")):
        r = json.loads(result.read_text())
        runs.append(
            {
                "run": result.parent.name,
                "status": r.get("status"),
                "val_loss": r.get("val_loss"),
                "wall_s": r.get("wall_s"),
                "device": (r.get("hardware") or {}).get("device"),
            }
        )
    return {**res, "runs": runs}


# ---- report -------------------------------------------------------------------------------------
def _gb(b: float | None) -> str:
    return "-" if b is None else f"{b / 1e9:.1f}"


def markdown(report: dict[str, Any]) -> str:
    env = report["env"]
    lines = [
        f"# loopscale GPU check ({env.get('device_name')}, torch {env.get('torch')}, {env.get('date')})",
        "",
        "| s | r | mode | rows | tokens/s | ms/step | MFU | peak GB (measured / predicted) | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in report.get("steps", []):
        note = m.get("skipped") or (m.get("error") or "")[:80]
        mfu = f"{100 * m['mfu']:.1f} %" if m.get("mfu") else "-"
        tps = f"{m['tokens_per_s']:,.0f}" if m.get("tokens_per_s") else "-"
        ms = f"{m['ms_per_step']:.1f}" if m.get("ms_per_step") else "-"
        lines.append(
            f"| {m.get('s')} | {m.get('r')} | {m.get('mode')} | {m.get('rows', '-')} | {tps} | {ms} | {mfu} "
            f"| {_gb(m.get('measured_peak_bytes'))} / {_gb(m.get('predicted_peak_bytes'))} | {note} |"
        )
    if report.get("packs") and isinstance(report["packs"], list):
        lines += [
            "",
            "## packs (k runs as one model)",
            "",
            "| d | k | mode | tokens/s (all members) | vs one solo run | ms/step | peak GB (measured / predicted) "
            "| note |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for m in report["packs"]:
            note = m.get("skipped") or (m.get("error") or "")[:80]
            tps = f"{m['tokens_per_s']:,.0f}" if m.get("tokens_per_s") else "-"
            vs = f"{m['vs_solo']:.2f}x" if m.get("vs_solo") else "-"
            ms = f"{m['ms_per_step']:.1f}" if m.get("ms_per_step") else "-"
            lines.append(
                f"| {m.get('d_model')} | {m.get('k')} | {m.get('mode', '-')} | {tps} | {vs} | {ms} "
                f"| {_gb(m.get('measured_peak_bytes'))} / {_gb(m.get('predicted_peak_bytes'))} | {note} |"
            )
    for name in ("train", "ddp", "sweep"):
        sec = report.get(name)
        if not sec:
            continue
        lines += ["", f"## {name}", ""]
        keep = {k: v for k, v in sec.items() if k not in ("log_tail", "loss_curve", "runs")}
        lines += [f"- {k}: {v}" for k, v in keep.items()]
        if sec.get("loss_curve"):
            curve = sec["loss_curve"]
            every = curve[:: max(1, len(curve) // 10)]
            lines.append("- loss curve (step, train loss): " + ", ".join(f"{s}: {v}" for s, v in every))
        for run in sec.get("runs", []):
            lines.append(f"- {run}")
        if sec.get("rc") not in (0, None):
            lines += ["", "```", sec.get("log_tail", ""), "```"]
    return "\n".join(lines) + "\n"


def write(report: dict[str, Any], out: Path) -> None:
    from loopscale.io import atomic_write_text

    atomic_write_text(out / "gpu_check.json", json.dumps(report, indent=1, default=str))
    atomic_write_text(out / "gpu_check.md", markdown(report))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    ap.add_argument("--smoke", action="store_true", help="toy sizes on CPU: checks the script, measures nothing")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting new work after this")
    ap.add_argument("--reserve-s", type=float, default=20.0, help="kept for writing the report")
    ap.add_argument("--s", type=int, nargs="+", default=[10, 20], help="widths (units of 64) to time")
    ap.add_argument("--rows", type=int, default=8, help="rows of T per timed step")
    ap.add_argument("--train-s", type=int, default=10, help="width of the 300-step run")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--sections", nargs="+", default=["steps", "packs", "train", "ddp", "sweep"])
    args = ap.parse_args()
    if args.smoke:
        args.s, args.train_s, args.no_compile = [1, 2], 1, True
    device = torch.device("cpu" if args.smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device (use --smoke on CPU)")
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    work.mkdir(exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "inductor"))
    clock = Clock(args.budget_s)
    report: dict[str, Any] = {
        "env": {
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "torch": torch.__version__,
            "versions": versions(),
            "device_name": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
            "gpus": torch.cuda.device_count() if device.type == "cuda" else 0,
            "peak_bf16": peak_flops(device, "bfloat16"),
            "smoke": args.smoke,
        }
    }
    sections = {
        "steps": lambda: section_steps(args, clock, device),
        "packs": lambda: section_packs(args, clock, device),
        "train": lambda: section_train(args, clock, work),
        "ddp": lambda: section_ddp(args, clock, work),
        "sweep": lambda: section_sweep(args, clock, work),
    }
    for name in args.sections:
        if clock.left() < args.reserve_s + 30:
            report[name] = {"skipped": "time budget"}
            continue
        t = time.time()
        try:
            report[name] = sections[name]()
        except Exception as e:
            report[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        report.setdefault("section_s", {})[name] = round(time.time() - t, 1)
        write(report, args.out)
        print(f"{name}: done in {time.time() - t:.0f} s", flush=True)
    write(report, args.out)
    print(markdown(report))


if __name__ == "__main__":
    main()
