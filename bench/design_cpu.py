"""bench: a CPU-scale prior for `loopscale design`, from the measured runs of docs/cpu-scale.md.

    python bench/design_cpu.py [OUT_DIR]      # writes OUT_DIR/cpu_L_runs.csv and OUT_DIR/cpu_L_fit.json

The paper's coefficients describe 10^8-10^9 parameters; at the CPU presets' 10^4-10^5 they predict
nonsense, so designing the `demo` and `study` grids needs a law fitted at CPU scale. The only CPU
runs recorded in the repository are the val losses of experiment L (docs/cpu-scale.md, "L: the study
preset, larger budgets": 6e11-2.4e12 FLOPs, d = 16-48, r = 1, 2, 4, 8 and loop-of-one r = 1
controls, one seed, loopscale's recipe before paper parity). This script turns that table into a
runs table (N_once, N_rec and D from the `study` spec's accounting, exactly as the sweep trained)
and fits it against the controls with the presets' Huber delta 0.02, as `loopscale demo` does
(docs/cpu-scale.md reports L' = 0.94 [0.55, 1.12] for this fit). The fit file is the prior of

    loopscale design demo  --prior OUT_DIR/cpu_L_fit.json --r1-from loop1 --noise-from OUT_DIR/cpu_L_runs.csv
    loopscale design study --prior OUT_DIR/cpu_L_fit.json --r1-from loop1 --noise-from OUT_DIR/cpu_L_runs.csv
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from loopscale.fit import FitSettings, fit_runs, load_runs, write_fit
from loopscale.fit.table import template_from_table
from loopscale.sweep import load_spec, plan_row

#: docs/cpu-scale.md, experiment L: val loss (nats/byte) per (C, d) for r = 1, 2, 4, 8 and the loop of one.
L_TABLE: dict[tuple[float, int], tuple[float, float, float, float, float]] = {
    (6e11, 16): (2.012, 2.101, 2.088, 2.125, 2.140),
    (6e11, 32): (2.064, 2.289, 2.226, 2.305, 2.279),
    (1.2e12, 16): (1.897, 2.005, 1.991, 2.003, 1.925),
    (1.2e12, 32): (1.828, 1.953, 1.995, 2.005, 1.982),
    (1.2e12, 48): (1.967, 2.183, 2.185, 2.209, 2.256),
    (2.4e12, 32): (1.664, 1.809, 1.803, 1.821, 1.726),
    (2.4e12, 48): (1.719, 1.881, 1.913, 1.893, 1.916),
}
COLUMN = {("baseline", 1): 0, ("baseline", 2): 1, ("baseline", 4): 2, ("baseline", 8): 3, ("loop1", 1): 4}


def runs_table() -> pd.DataFrame:
    spec = load_spec("study")
    rows = []
    for rs in spec.runs():
        if rs.seed != 0 or (rs.C, rs.d_model) not in L_TABLE or (rs.variant, rs.r) not in COLUMN:
            continue
        p = plan_row(rs, spec)
        m = rs.config.model
        rows.append(
            {
                "run_id": rs.run_id,
                "variant": rs.variant,
                "C": rs.C,
                "r": rs.r,
                "d_model": rs.d_model,
                "N_once": p.N_once,
                "N_rec": p.N_rec,
                "D": float(p.tokens),
                "batch_size": rs.config.run.batch_size,
                "seq_len": m.seq_len,
                "vocab_size": m.vocab_size,
                "head_dim": m.head_dim,
                "L_eff": m.L_eff,
                "n_prelude": 2,
                "n_coda": 2,
                "injection": "linear",
                "val_loss": L_TABLE[(rs.C, rs.d_model)][COLUMN[(rs.variant, rs.r)]],
            }
        )
    return pd.DataFrame(rows)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    df = runs_table()
    assert len(df) == 35, len(df)
    df.to_csv(out / "cpu_L_runs.csv", index=False)
    table = load_runs(out / "cpu_L_runs.csv").with_r1_control("loop1")
    settings = FitSettings(
        delta=0.02,
        variants=["baseline@loop1"],
        reference_variant="baseline@loop1",
        template={k: v for k, v in template_from_table(df).items()},
        law_variants=(),
    )
    fit = fit_runs(table, settings)
    write_fit(out / "cpu_L_fit.json", fit)
    v = fit.variant("baseline@loop1")
    p, ci = v.law.params.as_dict(), v.bootstrap.ci["phi"]
    print(
        f"{len(df)} runs; against the loop-of-one controls: phi = {p['phi']:.3f} [{ci[0]:.2f}, {ci[1]:.2f}], "
        f"alpha {p['alpha']:.3f}, beta {p['beta']:.3f}, E {p['E']:.3f}, A {p['A']:.4g}, B {p['B']:.4g}"
    )
    print(f"fit file: {out / 'cpu_L_fit.json'}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "bench_out"))
