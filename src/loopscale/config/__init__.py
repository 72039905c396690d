"""Typed configuration. Every field is named as in the paper (arXiv 2604.21106); errors name the field.

The configs that are data only, one per table: this module holds the machinery every config uses
(``StrictModel``, ``validate``, ``apply_overrides``, ``load_mapping``) and ``ModelConfig`` (``[model]``, which
``accounting`` and ``model`` build on); ``config.data`` holds ``[data]``, ``config.optim`` ``[optim]``. The
configs that compute from them live with their stage, above ``accounting``: ``train.settings`` (``[run]`` and
the whole ``TrainConfig``: steps and tokens from a budget), ``fit.settings`` (``FitSettings``, the spec's
``[fit]``), ``sweep.spec``. Shipped presets are TOML files in ``loopscale/presets/`` (presets/README.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from loopscale.errors import ConfigError, from_pydantic

Injection = Literal["linear", "additive", "passthrough", "hyperconnect"]


class StrictModel(BaseModel):
    """Base for every config: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ModelConfig(StrictModel):
    """Prelude-recur-coda layout and block shape (arXiv 2604.21106 §2).

    ``L_eff = n_prelude + r * n_recur + n_coda``; ``r = 1`` is the plain (non-looped) stack of
    ``L_eff`` unique layers. Width is ``d_model`` or the paper's ``s`` with ``d_model = 64 s``.
    """

    vocab_size: int = Field(256, gt=0, description="tokenizer vocabulary; padded to vocab_multiple")
    d_model: int | None = Field(None, gt=0, description="width; or give s (d_model = 64 s)")
    s: int | None = Field(None, gt=0, description="the paper's width unit: d_model = 64 s")
    head_dim: int = Field(128, gt=0, description="paper: 128; tiny CPU models need less")
    L_eff: int = Field(20, gt=0, description="effective depth n_prelude + r n_recur + n_coda")
    r: int = Field(1, gt=0, description="recurrences of the shared block during training")
    n_prelude: int = Field(2, ge=0)
    n_coda: int = Field(2, ge=0)
    seq_len: int = Field(2048, gt=0, description="T: tokens per training row")
    injection: Injection = "linear"
    hc_lanes: int = Field(2, gt=0, description="K lanes for injection = 'hyperconnect'")
    bptt_k: int | None = Field(None, gt=0, description="backprop through the last k recurrences")
    r1_looped: bool = Field(
        False,
        description="build r = 1 as a loop of one (injection + recurrent norm), "
        "not the plain stack: separates the loop's structure from weight sharing",
    )
    technique: str | None = Field(
        None,
        description="your own looped technique, 'module:Class' (a subclass of "
        "loopscale.technique.Technique; docs/extending.md); replaces the injection",
    )
    technique_options: dict[str, Any] = Field(default_factory=dict, description="keyword options of technique")
    mlp_ratio: int = Field(4, gt=0)
    softcap: float | None = Field(15.0, gt=0)
    rope_base: float = Field(10000.0, gt=0)
    norm_eps: float = Field(1e-6, gt=0)
    vocab_multiple: int = Field(64, gt=0)

    @field_validator("softcap", mode="before")
    @classmethod
    def _softcap_off(cls, v: Any) -> Any:
        """TOML has no null: ``softcap = "none"`` (as written into config.toml) turns the cap off."""
        return None if isinstance(v, str) and v.strip().lower() in ("none", "off", "null") else v

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.d_model is None and self.s is None:
            raise ConfigError("d_model", "set the width as d_model or as s (d_model = 64 s)")
        if self.d_model is not None and self.s is not None and self.d_model != 64 * self.s:
            raise ConfigError("d_model", f"disagrees with s={self.s} (expected {64 * self.s})", value=self.d_model)
        if self.width % self.head_dim:
            raise ConfigError("head_dim", f"must divide d_model={self.width}", value=self.head_dim)
        rest = self.L_eff - self.n_prelude - self.n_coda
        if rest <= 0:
            raise ConfigError(
                "L_eff", f"must exceed n_prelude + n_coda = {self.n_prelude + self.n_coda}", value=self.L_eff
            )
        if rest % self.r:
            raise ConfigError("r", f"must divide the recurrent depth L_eff - n_prelude - n_coda = {rest}", value=self.r)
        if self.technique is not None:
            if not self.is_looped:
                raise ConfigError(
                    "technique", "needs a loop: r > 1, or r1_looped = true for a loop of one", value=self.technique
                )
            if self.bptt_k is not None:
                raise ConfigError(
                    "bptt_k",
                    "a technique says which recurrences are back-propagated itself "
                    "(Technique.grad); leave bptt_k unset",
                    value=self.bptt_k,
                )
        elif self.technique_options:
            raise ConfigError("technique_options", "options without a model.technique", value=self.technique_options)
        if self.bptt_k is not None:
            if self.bptt_k > self.r:
                raise ConfigError("bptt_k", f"must be at most r={self.r}", value=self.bptt_k)
            if self.injection == "hyperconnect" and self.bptt_k < self.r:
                raise ConfigError("bptt_k", "hyperconnect needs full BPTT (bptt_k = r or unset)", value=self.bptt_k)
        return self

    # ---- derived shape -------------------------------------------------------------------
    @property
    def width(self) -> int:
        return self.d_model if self.d_model is not None else 64 * int(self.s)  # type: ignore[arg-type]

    @property
    def n_head(self) -> int:
        return self.width // self.head_dim

    @property
    def n_recur(self) -> int:
        return (self.L_eff - self.n_prelude - self.n_coda) // self.r

    @property
    def is_looped(self) -> bool:
        return self.r > 1 or self.r1_looped

    @property
    def vocab_padded(self) -> int:
        m = self.vocab_multiple
        return -(-self.vocab_size // m) * m

    @property
    def builtin_injection(self) -> str | None:
        """The built-in injection in use, or None when a technique replaces it."""
        return self.injection if self.technique is None else None

    @property
    def k_grad(self) -> int:
        """Recurrences that receive gradients (all of them unless truncated BPTT)."""
        return self.r if self.bptt_k is None else self.bptt_k

    @property
    def layout(self) -> str:
        if not self.is_looped:
            return f"{self.L_eff} unique"
        return f"{self.n_prelude}+{self.n_recur}x{self.r}+{self.n_coda}"


_M = TypeVar("_M", bound=StrictModel)


def validate(cls: type[_M], data: dict[str, Any], *, source: str | None = None, prefix: str = "") -> _M:
    """Build a config from a dict, turning pydantic's report into a one-line ConfigError."""
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        ctx_err = (err.errors()[0].get("ctx") or {}).get("error")
        if isinstance(ctx_err, ConfigError):
            loc = ".".join(str(p) for p in err.errors()[0].get("loc", ()))
            field = ".".join(p for p in (prefix, loc, ctx_err.field) if p)
            raise ConfigError(field, ctx_err.message, value=ctx_err.value, source=source) from None
        raise from_pydantic(err, source=source, prefix=prefix, known=lambda loc: _fields_at(cls, loc)) from None


def _fields_at(cls: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the (nested) config table at ``loc``: the candidates for 'did you mean'."""
    node: Any = cls
    for part in loc:
        field = getattr(node, "model_fields", {}).get(part)
        if field is None:
            return []
        node = field.annotation
    return list(getattr(node, "model_fields", {}))


def load_mapping(path: str | Path) -> dict[str, Any]:
    """Read a TOML or YAML file into a dict, with a one-line error naming the file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("path", "file not found", value=str(p))
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            "encoding",
            f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); save the file as UTF-8",
            source=str(p),
        ) from None
    except OSError as exc:
        raise ConfigError("path", f"cannot read the file: {exc.strerror or exc}", value=str(p)) from None
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            import tomllib

            data = tomllib.loads(text)
    except Exception as exc:  # parse errors from either library
        raise ConfigError("syntax", str(exc).splitlines()[0], source=str(p)) from None
    if not isinstance(data, dict):
        raise ConfigError("top level", "expected a table of keys", source=str(p))
    return data


def parse_value(text: str) -> Any:
    """Parse an override value as a TOML literal (numbers, bools, lists, strings), else a string."""
    import tomllib

    if text.strip().lower() in ("null", "none"):
        return None  # unset a default, e.g. --set run.steps=null --set run.budget=1e15
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:  # e.g. [[[...]]] thousands deep: no setting is nested like that
        raise ConfigError("--set", "value nested too deeply", value=text[:40] + "...") from None


def apply_overrides(data: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to a nested dict (a new dict is returned)."""
    import copy

    out = copy.deepcopy(data)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError("--set", "expected KEY=VALUE, e.g. model.r=4", value=item)
        key, _, raw = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError("--set", "empty key", value=item)
        node = out
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(key, f"'{p}' is a value, not a table", value=item)
            node = nxt
        node[parts[-1]] = parse_value(raw.strip())
    return out
