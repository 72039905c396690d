"""bench: do the Δφ intervals keep their level when the law is wrong? Simulated paired studies under misfit.

    python bench/paired_calibration.py --runs PILOT/runs.csv --fit PILOT/fit.json [--sims 80] [--draws 100]

The `probes` grid (the baseline's looped runs against the loop-of-one r = 1 runs, and truncated BPTT's own
runs with their own accounting: more tokens at equal C), fitted on seed means as `loopscale fit --seed-means`
does. Each simulated study draws both recipes from the pilot's law (``--fit``: its reference variant), the
technique's with phi moved by the true Δφ ∈ {-0.08, 0, +0.19}, plus a lack of fit the law cannot express:

* ``pattern``: the pilot's own misfit - each design point's seed-mean residual against its law, the same for
  both recipes (systematic: every study carries it), plus a part of the technique's own (random per point, sd
  the larger of the pilot's non-shared misfit and ``--own`` x the pattern's rms), plus seed noise;
* ``shared 1`` / ``shared 0.5`` / ``shared 0``: random cell and point misfit with the pilot's sds
  (``fit.design.estimate_noise``), correlated 1 / 0.5 / 0 between the recipes, plus seed noise.

Every study is read as `loopscale fit` reads it (``fit.paired_design.one_study``): the separate fits'
calibrated Δφ, both paired models, and the reading the leading rule picks. Printed per setting, Δφ and
reading: coverage of the true Δφ by the 95% interval, P(the interval excludes 0) (the false-positive rate
where Δφ = 0, the power elsewhere), the median half-width, the bias of the estimate and how often the
reading leads. Monte-Carlo sd of a rate p over n studies: sqrt(p (1 - p) / n) (0.024 at p = 0.95, n = 80).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit.design import DesignSettings, Noise, estimate_noise, point_keys
from loopscale.fit.fitfile import load_fit
from loopscale.fit.law.formula import params_to_theta
from loopscale.fit.law.formula import predict as predict_theta
from loopscale.fit.paired_design import READINGS, simulate_pair

TRUTHS = (-0.08, 0.0, 0.19)


def pilot(
    runs: Path, fit: Path, reference: str, technique: str
) -> tuple[dict[str, float], Noise, dict[str, float], float]:
    """The pilot's law, noise (seed-level sds), per-point misfit pattern and the technique's non-shared misfit."""
    from loopscale.fit import load_runs

    doc = load_fit(fit)
    law = {k: float(v) for k, v in doc.variant(reference).params.as_dict().items()}
    control = reference.split("@", 1)[1] if "@" in reference else None
    t = load_runs(runs)
    t = t.with_r1_control(control) if control else t
    base = t.for_variant(reference).df
    theta = params_to_theta(law)
    noise = estimate_noise(base, theta, source=str(runs), fitted=True)
    res = base["val_loss"].to_numpy(float) - predict_theta(theta, base["N_once"], base["N_rec"], base["D"], base["r"])
    pattern = pd.Series(res).groupby(point_keys(base)).mean().to_dict()
    tech = f"{technique}@{control}" if control else technique
    inference = doc.variant(tech).inference
    rec = inference.paired_delta_phi if inference is not None else None
    misfit = rec.shared_law.misfit if rec is not None and rec.shared_law is not None else None
    if misfit is None or misfit.not_shared_sd is None:
        raise SystemExit(f"{fit}: variants.{tech}.inference.paired_delta_phi.shared_law.misfit: no paired reading")
    own_log = float(misfit.not_shared_sd)  # log loss, per recipe, of seed means
    n_seeds = float(base.groupby(point_keys(base)).size().mean())
    nats = own_log * float(np.mean(base["val_loss"]))
    own = float(np.sqrt(max(nats**2 - noise.run_sd**2 / n_seeds, 0.0)))
    return law, noise, pattern, own


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, required=True, help="the pilot's runs table (every seed)")
    ap.add_argument("--fit", type=Path, required=True, help="the pilot's fit file (with the paired reading)")
    ap.add_argument("--spec", default="probes")
    ap.add_argument("--reference", default="baseline@loop1")
    ap.add_argument("--technique", default="truncated_bptt")
    ap.add_argument("--sims", type=int, default=80)
    ap.add_argument("--draws", type=int, default=100, help="wild-bootstrap tables per simulated fit")
    ap.add_argument("--settings", default="pattern,shared 1,shared 0.5,shared 0")
    ap.add_argument("--truths", default=",".join(map(str, TRUTHS)))
    ap.add_argument(
        "--own", type=float, default=0.5, help="the technique's own misfit, at least this x the pattern's rms"
    )
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="JSON of every summary")
    a = ap.parse_args()

    from loopscale.cli.design import planned_grid
    from loopscale.sweep import load_spec
    from startup import hardware

    spec = load_spec(a.spec, [])
    control = a.reference.split("@", 1)[1] if "@" in a.reference else None
    grid = planned_grid(spec, control)
    tech = planned_grid(spec, None, a.technique)
    law, noise, pattern, measured_own = pilot(a.runs, a.fit, a.reference, a.technique)
    own = max(measured_own, a.own * float(np.sqrt(np.mean(np.square(list(pattern.values()))))))
    st = DesignSettings(
        sims=a.sims, lr_draws=a.draws, restarts=100, delta=spec.fit.delta, workers=a.workers, seed_means=True
    )
    print(
        f"{a.spec}: {len(grid)} reference runs, {len(tech)} {a.technique} runs, seed means; pilot law phi "
        f"{law['phi']:.3f}; noise run {noise.run_sd:.4f}, cell {noise.cell_sd:.4f}, point {noise.point_sd:.4f} nats; "
        f"the pilot's misfit pattern rms {np.sqrt(np.mean(np.square(list(pattern.values())))):.4f}, technique's own "
        f"{own:.4f} (measured {measured_own:.4f}); {a.sims} studies per row, {a.draws} wild-bootstrap tables each; "
        f"{hardware()}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    print(
        f"{'setting':<11} {'Δφ':>6} {'reading':<23} {'cover':>6} {'excl 0':>7} {'med hw':>7} {'bias':>7} {'leads':>6}"
    )
    for setting in [s.strip() for s in a.settings.split(",")]:
        if setting == "pattern":
            nz, pat = Noise(noise.run_sd, 0.0, "pattern", point_sd=own, shared=0.0), pattern
            # the technique's own part: a misfit of sd `own` not shared (the reference's random part is 0 here)
        else:
            nz, pat = (
                Noise(noise.run_sd, noise.cell_sd, setting, point_sd=noise.point_sd, shared=float(setting.split()[1])),
                None,
            )
        for truth in (float(x) for x in a.truths.split(",")):
            t0 = time.perf_counter()
            res = simulate_pair(grid, tech, law, truth, nz, st, pattern=pat, ref_misfit=setting != "pattern")
            for k in READINGS:
                r = res.readings[k]
                lead = res.leads.get(k, float("nan")) if k != "leading" else float("nan")
                print(
                    f"{setting:<11} {truth:>+6.2f} {k:<23} {r.coverage:>6.3f} {r.reject_0:>7.3f} "
                    f"{r.median_half_width:>7.3f} {r.bias:>+7.3f} {lead:>6.2f}",
                    flush=True,
                )
                rows.append({"setting": setting, "delta_phi": truth, "reading": k, **r.__dict__, "leads": lead})
            print(f"  ({res.sims} studies, {time.perf_counter() - t0:.0f} s)", flush=True)
    if a.out:
        a.out.write_text(json.dumps({"hardware": hardware(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
