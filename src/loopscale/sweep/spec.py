"""The sweep spec: budgets x r x widths (x seeds) x recipe variants -> one TrainConfig per run.

A spec is a TOML file (``docs/sweep.md`` lists every key)::

    [sweep]
    name = "demo"
    budgets = [5e11, 1e12, 2e12]      # FLOPs C per run
    r = [1, 2, 4, 8]
    seeds = [0]                        # several seeds per cell: a lever for CPU-scale studies
    [sweep.widths]                     # explicit per budget (d_model or s), or a rule
    "5e11" = [16, 32, 48]
    [sweep.variants.truncated_bptt]    # recipes besides the implicit "baseline"
    model = { bptt_k = "half" }        # k = ceil(r / 2), the paper's probe
    widths_add = { "5e11" = [64] }     # extra widths of this variant's own runs (or widths = {...}: replace)
    [train.model]                      # the shared TrainConfig tables: model, data, optim, run
    head_dim = 16

r = 1 runs are shared by every variant (the paper reuses them across probes): they belong to
"baseline" unless a variant says ``r1 = "own"``; ``sweep.r1_model`` changes the model of every
r = 1 run (the paper's r = 1 baseline is a 0+20+0 loop of one, not the plain stack). A variant's
``widths`` / ``widths_add`` change only its own runs. Run ids are stable and readable:
``C1e+12_r4_d64_baseline_s0``. Every mistake is a one-line ConfigError naming the file and field.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from loopscale.config import ModelConfig, StrictModel, apply_overrides, load_mapping, validate
from loopscale.errors import ConfigError
from loopscale.fit.settings import FitTable
from loopscale.sweep import executor
from loopscale.sweep.runspec import RunSpec, budget_label, run_id_for
from loopscale.train.settings import TrainConfig, train_config_from_dict

BASELINE = "baseline"
_SET_BY_SWEEP = {"model": ("r", "d_model", "s"), "run": ("budget", "tokens", "steps", "seed")}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


# ---- spec tables ---------------------------------------------------------------------------
class Checks(StrictModel):
    """Thresholds of the planner's warnings (runs are still run; refused ones fail fast)."""

    min_tokens_per_param: float = Field(1.0, ge=0, description="warn below (heavily under-trained)")
    max_tokens_per_param: float = Field(1000.0, gt=0, description="warn above (far past compute-optimal)")
    max_run_hours: float | None = Field(None, gt=0, description="warn when a run's estimate exceeds this")
    budget_tolerance: float = Field(0.05, gt=0, description="warn when whole steps miss C by more")


class SweepTable(StrictModel):
    name: str = Field(..., description="sweep name; the default sweep dir is sweeps/<name>")
    budgets: list[float] = Field(..., description="FLOP budgets C")
    r: list[int] = Field(..., description="recurrences per run")
    seeds: list[int] = Field([0], description="run.seed of each run (several seeds per cell)")
    seed_data: bool = Field(False, description="seeds also set data.seed (a different data order per seed)")
    max_retries: int = Field(2, ge=0, description="retries of a failed run before it is left failed")
    widths: dict[str, Any] = Field(..., description="explicit widths per budget, or a rule")
    r1_model: dict[str, Any] = Field(
        default_factory=dict,
        description="[train.model] overrides of every r = 1 run (e.g. the paper's 0+20+0 loop of one)",
    )
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)
    checks: Checks = Field(default_factory=Checks)


class WidthRule(StrictModel):
    """``rule = "around_optimum"``: the k widths nearest the law's compute-optimal width."""

    rule: Literal["around_optimum"]
    k: int = Field(4, ge=1, description="widths per budget")
    step: int | None = Field(None, gt=0, description="spacing in `unit` (default: head_dim, or 2 for s)")
    unit: Literal["d_model", "s"] = "d_model"
    min: int | None = Field(None, gt=0, description="smallest width in `unit` (default: one step)")
    coefficients: str = Field("paper", description="'paper' or a fit file (JSON) from `loopscale fit`")
    fit_variant: str | None = Field(None, description="variant of the fit file (default: its reference)")
    per_r: bool = Field(False, description="centre each r on its own optimum instead of their geometric mean")


class Variant(StrictModel):
    """A recipe besides the baseline: TrainConfig overrides applied to its runs."""

    description: str = ""
    model: dict[str, Any] = Field(default_factory=dict)
    data: dict[str, Any] = Field(default_factory=dict)
    optim: dict[str, Any] = Field(default_factory=dict)
    run: dict[str, Any] = Field(default_factory=dict)
    r: list[int] | None = Field(None, description="subset of sweep.r (default: all)")
    r1: Literal["shared", "own"] = Field("shared", description="'shared': reuse the baseline's r = 1 runs")
    widths: dict[str, Any] = Field(default_factory=dict, description="replace some budgets' widths (sweep unit)")
    widths_add: dict[str, Any] = Field(default_factory=dict, description="add widths to some budgets (sweep unit)")

    def own_r(self, sweep_r: list[int]) -> list[int]:
        """The r of the runs this variant trains itself (shared r = 1 runs are the baseline's)."""
        return [r for r in (self.r or sweep_r) if not (r == 1 and self.r1 == "shared")]


@dataclass
class SweepSpec:
    """A validated spec. ``runs()`` expands it into RunSpecs; ``resolved_text()`` is spec.toml."""

    name: str
    source: str
    budgets: list[float]
    r: list[int]
    seeds: list[int]
    seed_data: bool
    max_retries: int
    checks: Checks
    widths: dict[tuple[float, int], list[int]]  # (C, r) -> d_model values
    width_unit: str
    width_rule: dict[str, Any] | None
    variants: dict[str, Variant]
    train: dict[str, Any]
    variant_widths: dict[str, dict[tuple[float, int], list[int]]] = field(default_factory=dict)  # own runs
    r1_model: dict[str, Any] = field(default_factory=dict)
    executors: dict[str, dict[str, Any]] = field(default_factory=dict)  # [local], [slurm], ... tables
    fit: FitTable = field(default_factory=FitTable)
    raw: dict[str, Any] = field(default_factory=dict)
    _runs: list[RunSpec] | None = field(default=None, repr=False)

    @property
    def variant_names(self) -> list[str]:
        return [BASELINE, *self.variants]

    def widths_for(self, variant: str, C: float, r: int) -> list[int]:
        """d_model values of ``variant``'s runs at (C, r): its own widths where it sets them, else the sweep's."""
        return self.variant_widths.get(variant, {}).get((C, r), self.widths[(C, r)])

    def runs(self, variants: list[str] | None = None, seeds: list[int] | None = None) -> list[RunSpec]:
        """Every run, in plan order (budget, variant, r, width, seed); r = 1 runs listed once.

        ``seeds`` keeps those seeds only: a sweep run one seed at a time is a whole grid after each.
        """
        if self._runs is None:
            self._runs = _expand(self)
        runs = list(self._runs)
        if seeds:
            unknown_seeds = [s for s in seeds if s not in self.seeds]
            if unknown_seeds:
                raise ConfigError(
                    "--seed", f"not in sweep.seeds = {self.seeds}", value=unknown_seeds[0], source=self.source
                )
            runs = [rs for rs in runs if rs.seed in seeds]
        if not variants:
            return runs
        unknown = [v for v in variants if v not in self.variant_names]
        if unknown:
            raise ConfigError(
                "--variant", f"not in the spec; it has {self.variant_names}", value=unknown[0], source=self.source
            )
        keep = set(variants)
        share_r1 = any(v == BASELINE or self.variants[v].r1 == "shared" for v in keep)
        return [rs for rs in runs if rs.variant in keep or (share_r1 and rs.r == 1 and rs.variant == BASELINE)]

    def resolved_text(self) -> str:
        """The spec as run: widths written out explicitly (a rule is resolved), executors kept."""
        import tomli_w

        data = copy.deepcopy(self.raw)
        sweep = data["sweep"]
        unit = self.width_unit
        scale = 64 if unit == "s" else 1
        widths: dict[str, Any] = {"unit": unit}
        for c in self.budgets:
            per_r = {r: [d // scale for d in self.widths[(c, r)]] for r in self.r}
            same = all(v == per_r[self.r[0]] for v in per_r.values())
            widths[budget_label(c)] = per_r[self.r[0]] if same else {f"r{r}": v for r, v in per_r.items()}
        sweep["widths"] = widths
        if self.width_rule:  # widths_add on top of a rule: write out what it gave (the rule may change)
            for name, per in self.variant_widths.items():
                table = sweep["variants"][name]
                table.pop("widths_add", None)
                table["widths"] = _width_table(per, self.budgets, self.variants[name].own_r(self.r), scale)
        head = f"# loopscale sweep spec as run (from {self.source})"
        if self.width_rule:
            rule = ", ".join(f"{k} = {v!r}" for k, v in self.width_rule.items())
            head += f"\n# widths resolved from the rule: {rule}"
        return head + "\n" + tomli_w.dumps(data)


# ---- loading ---------------------------------------------------------------------------------
def presets() -> list[str]:
    """Names of the specs shipped inside the package (``src/loopscale/presets/<name>.toml``)."""
    folder = resources.files("loopscale") / "presets"
    return sorted(f.name.removesuffix(".toml") for f in folder.iterdir() if f.name.endswith(".toml"))


def preset_path(name: str) -> Path:
    """A spec shipped with loopscale (e.g. ``demo``, ``paper``), found through the installed package."""
    res = resources.files("loopscale") / "presets" / f"{name}.toml"
    with resources.as_file(res) as p:
        return Path(p)


def resolve_spec_path(spec: str | Path) -> Path:
    """A spec file, a sweep dir (its spec.toml) or a preset name."""
    p = Path(spec)
    if p.is_dir() and (p / "spec.toml").is_file():
        return p / "spec.toml"
    if p.is_file():
        return p
    names = presets()
    if str(spec) in names:
        return preset_path(str(spec))
    raise ConfigError("SPEC", f"no such file or sweep dir, and not a preset ({', '.join(names)})", value=str(spec))


def plan_order(sweep_dir: Path) -> list[str]:
    """The run ids of a sweep dir's spec.toml in plan order (``SweepStore.planned``); none when it has no readable
    spec."""
    if not (sweep_dir / "spec.toml").is_file():
        return []
    try:
        return [rs.run_id for rs in load_spec(sweep_dir).runs()]
    except ConfigError:
        return []


def load_spec(spec: str | Path, overrides: list[str] | None = None) -> SweepSpec:
    """Read and validate a spec (path, sweep dir or preset name), with dotted ``--set`` overrides."""
    path = resolve_spec_path(spec)
    source = str(spec) if not Path(spec).exists() else str(path)
    data = load_mapping(path)
    if overrides:
        data = apply_overrides(data, overrides)
        source += " + --set"
    return spec_from_dict(data, source=source, base_dir=path.parent)


def spec_from_dict(data: dict[str, Any], *, source: str = "spec", base_dir: Path | None = None) -> SweepSpec:
    known = ["sweep", "train", *executor.names(), "fit"]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(unknown[0], f"unknown table; expected {', '.join(f'[{t}]' for t in known)}", source=source)
    if "sweep" not in data:
        raise ConfigError("sweep", "missing table [sweep] (name, budgets, r, widths)", source=source)
    raw_sweep = data["sweep"]
    if not isinstance(raw_sweep, dict):
        raise ConfigError("sweep", "expected a table", source=source)
    for key in ("budgets", "r", "seeds"):
        if key in raw_sweep and isinstance(raw_sweep[key], list) and not raw_sweep[key]:
            raise ConfigError(f"sweep.{key}", "is empty; list at least one value", source=source)
    table: SweepTable = validate(SweepTable, raw_sweep, source=source, prefix="sweep")
    _check_list(table.budgets, "sweep.budgets", source, positive=True)
    _check_list(table.r, "sweep.r", source, positive=True)
    _check_list(table.seeds, "sweep.seeds", source, positive=False)
    if not _NAME.match(table.name):
        raise ConfigError("sweep.name", "use letters, digits, '_', '-' or '.'", value=table.name, source=source)

    train = data.get("train") or {}
    if not isinstance(train, dict):
        raise ConfigError(
            "train", "expected a table with [train.model] [train.data] [train.optim] [train.run]", source=source
        )
    for tab in train:
        if tab not in ("model", "data", "optim", "run"):
            raise ConfigError(f"train.{tab}", "unknown table; expected model, data, optim, run", source=source)
    _forbid_sweep_keys(train, "train", source)

    variants: dict[str, Variant] = {}
    for name, vdata in table.variants.items():
        where = f"sweep.variants.{name}"
        if name == BASELINE:
            raise ConfigError(
                where, "'baseline' is the implicit recipe ([train]); give the variant another name", source=source
            )
        if not _NAME.match(name):
            raise ConfigError(where, "variant names use letters, digits, '_', '-' or '.'", value=name, source=source)
        if not isinstance(vdata, dict):
            raise ConfigError(where, "expected a table", source=source)
        v: Variant = validate(Variant, vdata, source=source, prefix=where)
        _forbid_sweep_keys({"model": v.model, "run": v.run}, where, source)
        if v.r is not None:
            if not v.r:
                raise ConfigError(f"{where}.r", "is empty; list at least one value or leave it out", source=source)
            _check_list(v.r, f"{where}.r", source, positive=True)
            extra = [x for x in v.r if x not in table.r]
            if extra:
                raise ConfigError(f"{where}.r", f"not in sweep.r = {table.r}", value=extra[0], source=source)
        variants[name] = v

    base_model = _base_model(train, source)
    widths, unit, rule = _resolve_widths(table, base_model, source, base_dir)
    for (c, _r), ds in widths.items():
        _check_heads(ds, base_model.head_dim, f"sweep.widths.{budget_label(c)}", unit, source)
    variant_widths = {}
    for name, v in variants.items():
        head_dim = v.model.get("head_dim")  # a bad value is reported by the run's config, named with the run
        head_dim = head_dim if isinstance(head_dim, int) and head_dim > 0 else base_model.head_dim
        own = _variant_widths(f"sweep.variants.{name}", v, table, widths, unit, rule is not None, head_dim, source)
        if own:
            variant_widths[name] = own
    _check_r1_model(table, train, source)
    rest = base_model.L_eff - base_model.n_prelude - base_model.n_coda
    for r in table.r:
        if rest % r:
            raise ConfigError(
                "sweep.r",
                f"must divide the recurrent depth L_eff - n_prelude - n_coda = {rest}",
                value=r,
                source=source,
            )

    executor.check_tables(data, source)  # typos fail at load, not at submit
    raw = copy.deepcopy(data)
    spec = SweepSpec(
        name=table.name,
        source=source,
        budgets=list(table.budgets),
        r=list(table.r),
        seeds=list(table.seeds),
        seed_data=table.seed_data,
        max_retries=table.max_retries,
        checks=table.checks,
        widths=widths,
        width_unit=unit,
        width_rule=rule,
        variants=variants,
        train=train,
        variant_widths=variant_widths,
        r1_model=dict(table.r1_model),
        executors={k: dict(data.get(k) or {}) for k in executor.names()},
        raw=raw,
        fit=validate(FitTable, data.get("fit") or {}, source=source, prefix="fit"),
    )
    spec.runs()  # build every config now: errors surface at load time, naming the run
    return spec


def _check_list(values: list[Any], where: str, source: str, *, positive: bool) -> None:
    seen = set()
    for v in values:
        if positive and not v > 0:
            raise ConfigError(where, "values must be positive", value=v, source=source)
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(where, "values must be finite", value=v, source=source)
        if v in seen:
            raise ConfigError(where, "duplicate value (it would duplicate runs)", value=v, source=source)
        seen.add(v)


def _forbid_sweep_keys(tables: dict[str, Any], prefix: str, source: str) -> None:
    for tab, keys in _SET_BY_SWEEP.items():
        sub = tables.get(tab) or {}
        if not isinstance(sub, dict):
            raise ConfigError(f"{prefix}.{tab}", "expected a table", source=source)
        for k in keys:
            if k in sub:
                what = {"r": "sweep.r", "d_model": "sweep.widths", "s": "sweep.widths", "seed": "sweep.seeds"}
                raise ConfigError(
                    f"{prefix}.{tab}.{k}",
                    f"is set by the sweep (from {what.get(k, 'sweep.budgets')}); remove it",
                    value=sub[k],
                    source=source,
                )


def _check_r1_model(table: SweepTable, train: dict[str, Any], source: str) -> None:
    """``sweep.r1_model``: model keys only, none the sweep sets, and a valid model at r = 1 with them."""
    if not table.r1_model:
        return
    if 1 not in table.r:
        raise ConfigError("sweep.r1_model", f"sweep.r = {table.r} has no r = 1 runs to apply it to", source=source)
    for k in _SET_BY_SWEEP["model"]:
        if k in table.r1_model:
            raise ConfigError(
                f"sweep.r1_model.{k}",
                "is set by the sweep (from sweep.r or sweep.widths); remove it",
                value=table.r1_model[k],
                source=source,
            )
    model = {**(train.get("model") or {}), **table.r1_model}
    model = _resolve_half({**model, "r": 1, "d_model": model.get("head_dim", 128)}, 1)
    validate(ModelConfig, model, source=source, prefix="sweep.r1_model")


def _base_model(train: dict[str, Any], source: str) -> ModelConfig:
    """The baseline [train.model] at its smallest legal width (for head_dim, depth and rule templates)."""
    from loopscale.train.settings import DEFAULT_MODEL

    model = dict(train.get("model") or {})
    head = model.get("head_dim", DEFAULT_MODEL["head_dim"])
    width = head if isinstance(head, int) and head > 0 else 64
    try:
        probe = train_config_from_dict(
            {
                "model": {**model, "d_model": width, "r": 1},
                "data": train.get("data") or {},
                "optim": train.get("optim") or {},
                "run": {**(train.get("run") or {}), "steps": 1},
            },
            source,
        )
    except ConfigError as err:
        raise ConfigError(f"train.{err.field}", err.message, value=err.value, source=source) from None
    return probe.model


# ---- widths ------------------------------------------------------------------------------------
def _parse_budget_key(key: str, budgets: list[float], source: str, where: str = "sweep.widths") -> float:
    try:
        c = float(key)
    except ValueError:
        raise ConfigError(f"{where}.{key}", 'keys are budgets written as numbers, e.g. "1e12"', source=source) from None
    for b in budgets:
        if math.isclose(b, c, rel_tol=1e-9):
            return b
    raise ConfigError(f"{where}.{key}", f"not one of sweep.budgets {[budget_label(b) for b in budgets]}", source=source)


def _check_heads(ds: list[int], head_dim: int, where: str, unit: str, source: str) -> None:
    for d in ds:
        if d % head_dim:
            raise ConfigError(
                where,
                f"width d_model={d} does not divide into heads of head_dim={head_dim}",
                value=d if unit == "d_model" else d // 64,
                source=source,
            )


def _width_list(values: Any, where: str, unit: str, source: str) -> list[int]:
    if not isinstance(values, list):
        raise ConfigError(where, f"expected a list of widths ({unit})", value=values, source=source)
    if not values:
        raise ConfigError(where, "is empty; list at least one width", source=source)
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ConfigError(where, f"widths are positive integers ({unit})", value=v, source=source)
        if v in out:
            raise ConfigError(where, "duplicate width (it would duplicate runs)", value=v, source=source)
        out.append(v)
    scale = 64 if unit == "s" else 1
    return [v * scale for v in out]


def _resolve_widths(
    table: SweepTable, base: ModelConfig, source: str, base_dir: Path | None
) -> tuple[dict[tuple[float, int], list[int]], str, dict | None]:
    w = dict(table.widths)
    if "rule" in w:
        rule: WidthRule = validate(WidthRule, w, source=source, prefix="sweep.widths")
        return _rule_widths(rule, table, base, source, base_dir), rule.unit, rule.model_dump(exclude_none=True)
    unit = w.pop("unit", "d_model")
    if unit not in ("d_model", "s"):
        raise ConfigError("sweep.widths.unit", "expected 'd_model' or 's' (d_model = 64 s)", value=unit, source=source)
    out: dict[tuple[float, int], list[int]] = {}
    for key, values in w.items():
        c = _parse_budget_key(key, table.budgets, source)
        where = f"sweep.widths.{key}"
        if isinstance(values, dict):
            keys = {f"r{r}" for r in table.r}
            bad = sorted(set(values) - keys)
            if bad:
                raise ConfigError(f"{where}.{bad[0]}", f"expected keys {sorted(keys)} (one list per r)", source=source)
            for r in table.r:
                if f"r{r}" not in values:
                    raise ConfigError(f"{where}.r{r}", "missing: a per-r table needs every r of sweep.r", source=source)
                out[(c, r)] = _width_list(values[f"r{r}"], f"{where}.r{r}", unit, source)
        else:
            ds = _width_list(values, where, unit, source)
            for r in table.r:
                out[(c, r)] = ds
    for c in table.budgets:
        if (c, table.r[0]) not in out:
            raise ConfigError(
                f"sweep.widths.{budget_label(c)}",
                'missing: every budget needs its widths (or use rule = "around_optimum")',
                source=source,
            )
    return out, unit, None


def _variant_widths(
    where: str,
    v: Variant,
    table: SweepTable,
    base: dict[tuple[float, int], list[int]],
    unit: str,
    ruled: bool,
    head_dim: int,
    source: str,
) -> dict[tuple[float, int], list[int]]:
    """A variant's own widths: the sweep's, with ``widths`` replacing and ``widths_add`` extending budgets.

    Under a width rule an added width the rule already chose is kept once (the rule's choice is not
    known when the spec is written); with explicit widths it is an error (a typo or a stale list).
    """
    if not v.widths and not v.widths_add:
        return {}
    own = v.own_r(table.r)
    replace = _variant_width_table(v.widths, f"{where}.widths", table.budgets, own, unit, head_dim, source)
    add = _variant_width_table(v.widths_add, f"{where}.widths_add", table.budgets, own, unit, head_dim, source)
    key_of = {_parse_budget_key(k, table.budgets, source): k for k in v.widths_add}  # errors name the key as written
    both = [c for c in table.budgets if any(b == c for b, _ in replace) and any(b == c for b, _ in add)]
    if both:
        raise ConfigError(
            f"{where}.widths_add.{key_of[both[0]]}",
            "this budget is also in widths (which replaces its widths); list its full set there",
            source=source,
        )
    out = {key: replace.get(key, base[key]) for key in ((c, r) for c in table.budgets for r in own)}
    for (c, r), ds in add.items():
        dup = [d for d in ds if d in out[(c, r)]]
        if dup and not ruled:
            raise ConfigError(
                f"{where}.widths_add.{key_of[c]}",
                f"already in sweep.widths (r = {r}); list only the widths to add",
                value=dup[0] // (64 if unit == "s" else 1),
                source=source,
            )
        out[(c, r)] = sorted({*out[(c, r)], *ds})
    return out


def _variant_width_table(
    raw: dict[str, Any], where: str, budgets: list[float], own: list[int], unit: str, head_dim: int, source: str
) -> dict[tuple[float, int], list[int]]:
    """``{budget = [widths]}`` or ``{budget = {rK = [widths]}}`` -> (C, r) -> d_model values."""
    out: dict[tuple[float, int], list[int]] = {}
    for key, values in raw.items():
        c = _parse_budget_key(key, budgets, source, where)
        if any(b == c for b, _ in out):
            raise ConfigError(f"{where}.{key}", "the same budget twice", source=source)
        per_r = values if isinstance(values, dict) else {f"r{r}": values for r in own}
        names = {f"r{r}": r for r in own}
        for rk, ds in per_r.items():
            if rk not in names:
                raise ConfigError(
                    f"{where}.{key}.{rk}",
                    f"expected keys {sorted(names)} (the r of this "
                    "variant's own runs; shared r = 1 runs keep the baseline's widths)",
                    source=source,
                )
            loc = f"{where}.{key}" + (f".{rk}" if isinstance(values, dict) else "")
            out[(c, names[rk])] = _width_list(ds, loc, unit, source)
            _check_heads(out[(c, names[rk])], head_dim, loc, unit, source)
    return out


def _width_table(
    widths: dict[tuple[float, int], list[int]], budgets: list[float], rs: list[int], scale: int
) -> dict[str, Any]:
    """(C, r) -> d_model back to TOML: one list per budget, or a per-r table where the r differ."""
    out: dict[str, Any] = {}
    for c in budgets:
        per_r = {r: [d // scale for d in widths[(c, r)]] for r in rs}
        same = all(ds == per_r[rs[0]] for ds in per_r.values())
        out[budget_label(c)] = per_r[rs[0]] if same else {f"r{r}": ds for r, ds in per_r.items()}
    return out


def _rule_widths(
    rule: WidthRule, table: SweepTable, base: ModelConfig, source: str, base_dir: Path | None
) -> dict[tuple[float, int], list[int]]:
    """k widths (multiples of ``step``) nearest in log-width to the law's optimum per budget."""
    import numpy as np

    from loopscale.fit.allocation import law_frontier
    from loopscale.fit.law.joint import JointLaw
    from loopscale.fit.paper import PAPER_COEFFICIENTS

    scale = 64 if rule.unit == "s" else 1
    step = (rule.step or (2 if rule.unit == "s" else base.head_dim)) * scale
    if step % base.head_dim:
        raise ConfigError(
            "sweep.widths.step",
            f"d_model step {step} does not divide into heads of head_dim={base.head_dim}",
            value=rule.step,
            source=source,
        )
    lo = (rule.min or step // scale) * scale
    if rule.coefficients == "paper":
        theta = JointLaw.from_params(**PAPER_COEFFICIENTS).theta_
    else:
        from loopscale.fit.fitfile import law_from_fit, read_fit

        p = Path(rule.coefficients)
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        if not p.is_file():
            raise ConfigError(
                "sweep.widths.coefficients", "expected 'paper' or a fit file", value=str(p), source=source
            )
        theta = law_from_fit(read_fit(p), rule.fit_variant)[0].theta_
    template = base.model_dump(exclude={"d_model", "s", "r"})
    out: dict[tuple[float, int], list[int]] = {}
    for c in table.budgets:
        opt = {r: float(law_frontier(theta, template, [c], r)["d"][0]) for r in table.r}
        for r in table.r:
            centre = opt[r] if rule.per_r else math.exp(float(np.mean(np.log(list(opt.values())))))
            m0 = max(1, round(centre / step))
            cands = [m * step for m in range(max(1, m0 - rule.k - 1), m0 + rule.k + 2) if m * step >= lo]

            def nearest(d: int, centre: float = centre) -> tuple[float, int]:
                return abs(math.log(d / centre)), d

            cands.sort(key=nearest)
            out[(c, r)] = sorted(cands[: rule.k])
    return out


# ---- expansion ---------------------------------------------------------------------------------
def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _resolve_half(model: dict[str, Any], r: int) -> dict[str, Any]:
    if model.get("bptt_k") == "half":
        model["bptt_k"] = math.ceil(r / 2)  # the paper's truncated-BPTT probe: the last ceil(r/2) recurrences
    return model


def _run_config(spec: SweepSpec, variant: str, C: float, r: int, d: int, seed: int, run_id: str) -> TrainConfig:
    """[train], then (r = 1) sweep.r1_model, then the variant's tables, then the sweep's own keys."""
    data = copy.deepcopy(spec.train)
    if r == 1 and spec.r1_model:
        data = _deep_merge(data, {"model": spec.r1_model})
    if variant != BASELINE:
        v = spec.variants[variant]
        data = _deep_merge(data, {"model": v.model, "data": v.data, "optim": v.optim, "run": v.run})
    model = _resolve_half(dict(data.get("model") or {}), r)
    model.update(r=r, d_model=d)
    run = dict(data.get("run") or {})
    run.update(budget=C, seed=seed)
    data["model"], data["run"] = model, run
    if spec.seed_data:
        data["data"] = {**(data.get("data") or {}), "seed": seed}
    try:
        return train_config_from_dict(data, f"{spec.source} [run {run_id}]")
    except ConfigError as err:
        raise ConfigError(err.field, err.message, value=err.value, source=f"{spec.source} [run {run_id}]") from None


def _expand(spec: SweepSpec) -> list[RunSpec]:
    runs: list[RunSpec] = []
    seen: dict[str, str] = {}
    for c in spec.budgets:
        for variant in spec.variant_names:
            v = spec.variants.get(variant)
            rs = v.r if v is not None and v.r else spec.r
            for r in rs:
                if r == 1 and v is not None and v.r1 == "shared":
                    continue  # the baseline's r = 1 runs serve every variant
                for d in spec.widths_for(variant, c, r):
                    for seed in spec.seeds:
                        rid = run_id_for(c, r, d, variant, seed)
                        if rid in seen:
                            raise ConfigError("sweep", f"duplicate runs: {rid} appears twice", source=spec.source)
                        seen[rid] = rid
                        cfg = _run_config(spec, variant, c, r, d, seed, rid)
                        runs.append(RunSpec(rid, variant, seed, c, r, d, cfg))
    _check_distinct_configs(runs, spec.source)
    return runs


def _check_distinct_configs(runs: list[RunSpec], source: str) -> None:
    """Two ids with the same config would train the same model twice (e.g. a variant that changes nothing)."""
    import json

    first: dict[str, str] = {}
    for rs in runs:
        key = json.dumps(rs.config.model_dump(mode="json"), sort_keys=True)
        if key in first:
            raise ConfigError(
                "sweep.variants",
                f"duplicate runs: {rs.run_id} trains the same config as "
                f"{first[key]} (does the variant change anything at r = {rs.r}?)",
                source=source,
            )
        first[key] = rs.run_id
