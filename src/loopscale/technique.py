"""Looped techniques a user brings in their own file: ``model.technique = "my_pkg.loops:Gated"``.

A technique is how the loop carries its state (arXiv 2604.21106 §2, "Input injection", and the probes of
§5): ``state = init(e)``; per recurrence i ``u = input(i, e, state)``, ``s = norm_recur(block(i, recur,
u))``, ``state = update(i, state, s)``; the coda reads ``readout(state)``. The built-in injections are
techniques (``loopscale.model.injection`` subclasses ``Technique``); a user's technique subclasses it too,
and may also wrap the recurrent block (``block``), add parameters that run once or per recurrence
(``runs``), and leave recurrences out of back-propagation (``grad``, as truncated BPTT does).

Accounting follows the technique (docs/extending.md, "A new looped technique"): its parameters and FLOPs
are measured from the module — parameters from its module tree, matmul FLOPs per token with
``torch.utils.flop_counter`` on meta tensors — and checked against what the class declares
(``declared``), if it declares anything, within ``TOLERANCE``. A config that names code runs that code;
loopscale imports only the module the config names.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from loopscale.errors import ConfigError

if TYPE_CHECKING:
    from loopscale.config import ModelConfig

FIELD = "model.technique"
TOLERANCE = 0.01
"""Relative disagreement allowed between a technique's declared and measured parameters and FLOPs."""
_PROBE_T = 8  # tokens in the meta-tensor probe (FLOPs are divided by it)


class Technique(nn.Module):
    """The loop's state handling; override what your technique changes (docs/extending.md).

    Constructed as ``Technique(d_model, r, **options)`` with ``options`` from ``[model.technique_options]``.
    """

    runs: ClassVar[str] = "recurrence"
    """Where the technique's parameters count: "recurrence" (N_rec, beside the shared block, whose FLOPs are
    charged per recurrence) or "once" (N_once). Override ``placement`` to split them."""

    def __init__(self, d_model: int = 0, r: int = 1, **options: Any) -> None:
        super().__init__()
        if options:
            raise TypeError(f"unexpected options {sorted(options)}")

    def reset_parameters(self) -> None:
        """Initialise the technique's parameters (called after the model's own init)."""

    def init(self, e: torch.Tensor) -> torch.Tensor:
        return e

    def input(self, i: int, e: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return state

    def block(self, i: int, recur: Callable[[torch.Tensor], torch.Tensor], u: torch.Tensor) -> torch.Tensor:
        """Run the shared recurrent blocks on ``u`` at recurrence ``i`` (wrap them here: adapters, gates)."""
        return recur(u)

    def update(self, i: int, state: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return s

    def readout(self, state: torch.Tensor) -> torch.Tensor:
        return state

    def supports_r(self, r: int) -> bool:
        """Can the technique run ``r`` recurrences (test-time recurrence)? Per-recurrence parameters say no
        beyond the training r."""
        return True

    def grad(self, i: int, r: int) -> bool:
        """Is recurrence ``i`` of ``r`` back-propagated? (False: it runs under ``no_grad``, a forward pass only.)"""
        return True

    def placement(self, name: str, p: nn.Parameter) -> str:
        """ "once" or "recurrence" for one of the technique's parameters (default: the class's ``runs``)."""
        return self.runs

    def param_group(self, name: str, p: nn.Parameter) -> str:
        """The optimiser group: "matrix" (Muon, 2-D weights) or "scalar" (AdamW, everything else)."""
        return "matrix" if p.dim() == 2 else "scalar"

    @classmethod
    def declared(cls, d_model: int, r: int, options: dict[str, Any]) -> dict[str, float] | None:
        """What the technique costs, if you can say: any of ``params_once``, ``params_rec``,
        ``flops_once`` and ``flops_rec`` (forward matmul FLOPs per token: once, and per recurrence on
        average). Each is checked against the measurement; None: measured only."""
        return None


@dataclass(frozen=True)
class Cost:
    """A technique's accounting at one (d_model, r): parameters by where they run, forward matmul FLOPs
    per token (once, and per recurrence averaged over the r recurrences), and the back-propagated recurrences."""

    params_once: int
    params_rec: int
    flops_once: float
    flops_rec: float
    grad_recurrences: int


ENTRY_POINTS = "loopscale.techniques"


def registered() -> dict[str, str]:
    """Techniques installed packages register by name (entry-point group ``loopscale.techniques``): name ->
    ``module:Class``. Reading the group imports nothing."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINTS)}


def load(spec: str) -> type[Technique]:
    """The class ``module:Class`` (or ``path/to/file.py:Class``, or a name registered under the entry-point
    group ``loopscale.techniques``) names, or a one-line ``ConfigError`` naming ``model.technique``. Only
    that module is imported."""
    if ":" not in str(spec) and str(spec).isidentifier():
        names = registered()
        if str(spec) not in names:
            raise ConfigError(
                FIELD,
                f"no technique registered as {spec!r} (entry-point group {ENTRY_POINTS} "
                f"has {sorted(names)}); or give 'module:Class' / 'path/to/file.py:Class'",
                value=spec,
            )
        return load(names[str(spec)])
    module, sep, name = str(spec).rpartition(":")
    is_file = module.endswith(".py")
    if (
        not sep
        or not module
        or not name
        or not all(p.isidentifier() for p in name.split("."))
        or (not is_file and not all(p.isidentifier() for p in module.split(".")))
    ):
        raise ConfigError(FIELD, "expected 'module:Class' or 'path/to/file.py:Class' (then a class in it)", value=spec)
    try:
        mod = _import_file(Path(module)) if is_file else importlib.import_module(module)
    except ConfigError:
        raise
    except Exception as exc:  # the user's module: any error while importing it is theirs, named in one line
        where = "does the file exist?" if is_file else "is it installed or on PYTHONPATH?"
        raise ConfigError(
            FIELD, f"cannot import {module!r} ({type(exc).__name__}: {exc}); {where}", value=spec
        ) from None
    obj: Any = mod
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ConfigError(FIELD, f"{module!r} has no {name!r}", value=spec)
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, Technique)):
        raise ConfigError(FIELD, f"{name!r} is not a subclass of loopscale.technique.Technique", value=spec)
    return obj


def _import_file(path: Path) -> Any:
    """A technique file as a module, once per content (its name carries the file's hash)."""
    import hashlib
    import importlib.util
    import sys

    data = path.read_bytes()
    name = f"loopscale_technique_{path.stem}_{hashlib.sha256(data).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(FIELD, f"{path} is not a Python file", value=str(path))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def source_sha256(cfg: ModelConfig) -> str | None:
    """The hash of the file that defines the config's technique (recorded with each run, so a resumed or
    compared run can tell that the code changed)."""
    import hashlib
    import inspect

    try:
        path = inspect.getsourcefile(load(cfg.technique or ""))
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None
    except (OSError, TypeError):
        return None


def build(cfg: ModelConfig, device: str | torch.device | None = None) -> Technique:
    """Instantiate the config's technique (``Technique(d_model, r, **technique_options)``)."""
    return _build(cfg.technique or "", dict(cfg.technique_options), cfg.width, cfg.r, device)


def _build(
    spec: str, options: dict[str, Any], d_model: int, r: int, device: str | torch.device | None = None
) -> Technique:
    cls = load(spec)
    try:
        with torch.device(device) if device is not None else contextlib.nullcontext():
            return cls(d_model, r, **options)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError("model.technique_options", f"{spec} refused them: {exc}", value=options) from None


def cost(cfg: ModelConfig) -> Cost:
    """The technique's accounting (measured, checked against its declaration); cached per config shape."""
    return _cost(cfg.technique or "", json.dumps(cfg.technique_options, sort_keys=True, default=str), cfg.width, cfg.r)


@functools.lru_cache(maxsize=64)
def _cost(spec: str, options_json: str, d_model: int, r: int) -> Cost:
    options = json.loads(options_json)
    tech = _build(spec, options, d_model, r, device="meta")
    once = rec = 0
    for name, p in tech.named_parameters():
        where = tech.placement(name, p)
        if where not in ("once", "recurrence"):
            raise ConfigError(FIELD, f"placement of parameter {name!r} must be 'once' or 'recurrence'", value=where)
        once, rec = (once + p.numel(), rec) if where == "once" else (once, rec + p.numel())
    e = torch.empty(1, _PROBE_T, d_model, device="meta")
    try:
        with torch.no_grad():
            state, flops_init = _counted(tech.init, e)
            state, per_rec = _probe_loop(tech, e, state, r)
            out, flops_readout = _counted(tech.readout, state)
        flops_once = flops_init + flops_readout
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            FIELD,
            f"{spec} failed on a probe batch [1, {_PROBE_T}, {d_model}] ({type(exc).__name__}: {exc})",
            value=spec,
        ) from None
    _same_shape(tech, "readout(state)", out, e)
    measured = Cost(
        params_once=once,
        params_rec=rec,
        flops_once=flops_once / _PROBE_T,
        flops_rec=sum(per_rec) / r / _PROBE_T,
        grad_recurrences=sum(tech.grad(i, r) for i in range(r)),
    )
    _check_declared(type(tech), spec, d_model, r, options, measured)
    return measured


def _counted(fn: Callable[..., Any], *args: Any) -> tuple[Any, int]:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        out = fn(*args)
    return out, int(counter.get_total_flops())


def _probe_loop(tech: Technique, e: torch.Tensor, state: torch.Tensor, r: int) -> tuple[torch.Tensor, list[int]]:
    """One pass of the loop on meta tensors with the recurrent blocks as the identity: the technique's own
    FLOPs per recurrence, and its shapes checked (``input`` and ``block`` give the stream's shape)."""
    per_rec = []
    for i in range(r):
        u, f_in = _counted(tech.input, i, e, state)
        _same_shape(tech, "input(i, e, state)", u, e)
        s, f_block = _counted(tech.block, i, lambda x: x, u)
        _same_shape(tech, "block(i, recur, u)", s, e)
        state, f_up = _counted(tech.update, i, state, s)
        per_rec.append(f_in + f_block + f_up)
    return state, per_rec


def _same_shape(tech: Technique, what: str, got: Any, e: torch.Tensor) -> None:
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(e.shape):
        shape = list(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise ConfigError(
            FIELD,
            f"{what} must return a tensor of the stream's shape {list(e.shape)}, got {shape}",
            value=type(tech).__name__,
        )


def _check_declared(
    cls: type[Technique], spec: str, d_model: int, r: int, options: dict[str, Any], measured: Cost
) -> None:
    declared = cls.declared(d_model, r, options) or {}
    for key, value in declared.items():
        if key not in ("params_once", "params_rec", "flops_once", "flops_rec"):
            raise ConfigError(
                FIELD,
                f"declared() has an unknown key {key!r}; expected params_once, params_rec, flops_once or flops_rec",
                value=spec,
            )
        got = float(getattr(measured, key))
        if abs(float(value) - got) > TOLERANCE * max(abs(got), 1.0):
            raise ConfigError(
                FIELD,
                f"declares {key} = {float(value):.6g} but measures {got:.6g} (at d_model = "
                f"{d_model}, r = {r}; tolerance {TOLERANCE:.0%})",
                value=spec,
            )
