"""Export a run as a Hugging Face folder: the form researchers share, load and evaluate models in.

``export_hf(run_dir, out)`` writes config.json (with ``auto_map`` to the shipped ``modeling_loopscale.py``),
model.safetensors with the *real* vocabulary (loopscale pads embedding and head to ``vocab_multiple``; the
padded rows never enter the softmax, so they are dropped), tokenizer.json + tokenizer_config.json (BOS
declared and prepended, as loopscale scores every text after BOS) and a model card. Loading needs only
torch and transformers: ``AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)``.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loopscale.errors import ConfigError

if TYPE_CHECKING:
    from loopscale.record import RunRecord

MODELING = "modeling_loopscale.py"
BOS = "<|bos|>"


def hf_config(cfg: Any, *, bos_id: int) -> dict[str, Any]:
    """config.json for a loopscale ``TrainConfig``."""
    m = cfg.model
    return {
        "architectures": ["LoopscaleForCausalLM"],
        "model_type": "loopscale",
        "auto_map": {
            "AutoConfig": "modeling_loopscale.LoopscaleConfig",
            "AutoModelForCausalLM": "modeling_loopscale.LoopscaleForCausalLM",
        },
        "vocab_size": m.vocab_size,
        "hidden_size": m.width,
        "head_dim": m.head_dim,
        "n_prelude": m.n_prelude,
        "n_recur": m.n_recur,
        "n_coda": m.n_coda,
        "train_recur": m.r,
        "num_recur": m.r,
        "injection": m.injection,
        "hc_lanes": m.hc_lanes,
        "r1_looped": m.r1_looped,
        "mlp_ratio": m.mlp_ratio,
        "softcap": m.softcap,
        "rope_base": m.rope_base,
        "norm_eps": m.norm_eps,
        "max_position_embeddings": m.seq_len,
        "bos_token_id": bos_id,
        "eos_token_id": bos_id,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def unpadded_state_dict(model: Any) -> dict[str, Any]:
    """The model's tensors with embedding and head cut to the real vocabulary (contiguous, on CPU)."""
    V = model.cfg.vocab_size
    out = {}
    for k, v in model.state_dict().items():
        t = v.detach().to("cpu")
        if k in ("embed.weight", "head.weight"):
            t = t[:V]
        out[k] = t.contiguous()
    return out


def byte_tokenizer_json() -> str:
    """loopscale's byte tokenizer (ids 0-255 = UTF-8 bytes, 256 = ``<|bos|>``) as a ``tokenizers`` file."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_char = _bytes_to_unicode()
    vocab = {byte_char[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BOS])
    return tok.to_str()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, the one ByteLevel pre-tokenization uses."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def _with_bos(tokenizer_json: str, bos: str, bos_id: int) -> str:
    """The tokenizer with a post-processor that prepends BOS (``add_special_tokens=True``, transformers' default)."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_str(tokenizer_json)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, bos_id)]
    )
    return tok.to_str()


def _tokenizer_files(cfg: Any) -> tuple[str, str, int]:
    """(tokenizer.json text, BOS token, BOS id) for the run's tokenizer."""
    if cfg.data.tokenizer == "bytes":
        from loopscale.data.tokenizer import ByteTokenizer

        return byte_tokenizer_json(), BOS, ByteTokenizer.bos_id
    from loopscale.data.hf_tokenizer import HFTokenizer

    tok = HFTokenizer(cfg.data.tokenizer, cfg.data.bos_token)
    return Path(cfg.data.tokenizer).read_text(encoding="utf-8"), tok.bos_token, tok.bos_id


def model_card(cfg: Any, run_dir: Path, result: RunRecord | None) -> str:
    m = cfg.model
    looped = m.r > 1 or m.r1_looped
    layout = (
        f"{m.n_prelude} prelude + {m.n_recur} recurrent x r = {m.r} + {m.n_coda} coda blocks"
        if looped
        else f"{m.L_eff} unique blocks (the plain, non-looped r = 1 baseline)"
    )
    val = result.val_loss if result is not None else None
    lines = [
        "---",
        "library_name: transformers",
        "tags: [loopscale, looped-transformer, depth-recurrence]",
        "---",
        "",
        f"# {run_dir.name}: a looped transformer trained with loopscale",
        "",
        "A prelude-recur-coda language model (arXiv 2604.21106 §2): the recurrent blocks share weights and "
        "run r times, with the loop's state fed back through an input injection.",
        "",
        "| | |",
        "|---|---|",
        f"| layout | {layout} |",
        f"| effective depth L_eff | {m.L_eff} |",
        f"| width d_model / head_dim | {m.width} / {m.head_dim} |",
        f"| training r | {m.r} |",
        f"| injection | {m.injection if looped else 'none'} |",
        f"| vocabulary | {m.vocab_size} ({'bytes + <|bos|>' if cfg.data.tokenizer == 'bytes' else 'tokenizer.json'}) |",
        f"| context | {m.seq_len} tokens |",
        f"| softcap | {m.softcap} |",
    ]
    if val is not None:
        lines.append(f"| validation loss | {val:.4f} nats/token |")
    if result is not None and result.val_bpb is not None:
        lines.append(f"| validation bits per byte | {result.val_bpb:.4f} |")
    lines += [
        "",
        "## Load",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "model = AutoModelForCausalLM.from_pretrained(PATH, trust_remote_code=True)",
        "tok = AutoTokenizer.from_pretrained(PATH)",
        "ids = tok('The king', return_tensors='pt').input_ids  # BOS is prepended",
        f"logits = model(ids).logits                # r = {m.r}, as trained",
        "logits = model(ids, r=8).logits           # test-time recurrences (looped models)",
        "model.config.num_recur = 8                # or for every call, generate included",
        "```",
        "",
        "`modeling_loopscale.py` needs only torch and transformers. Evaluate with lm-evaluation-harness:",
        "",
        "```bash",
        "lm_eval --model hf --model_args pretrained=PATH,trust_remote_code=True --tasks lambada_openai --device cpu",
        "```",
        "",
        "Exported by `loopscale export` from the run's model.safetensors and config.toml (config.toml is kept "
        "beside this card as loopscale_config.toml).",
        "",
    ]
    return "\n".join(lines)


def export_hf(run_dir: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """Write the Hugging Face folder ``out`` for the finished run in ``run_dir``; returns ``out``.

    OUT is locked while it is written (``loopscale.locks``): a second export into it is refused, as is exporting
    a run a live process is training."""
    from loopscale import locks
    from loopscale.train.checkpoint import load_model

    run_dir, out = Path(run_dir), Path(out)
    if run_dir.is_file():
        run_dir = run_dir.parent
    locks.refuse_if_held(run_dir, field="RUN", doing="exporting it")
    model, cfg = load_model(run_dir)
    if cfg.model.technique is not None:
        raise ConfigError(
            "RUN",
            f"trained with a technique from your own code ({cfg.model.technique}); the Hugging "
            "Face folder's modeling_loopscale.py cannot carry it, so it is not exported (evaluate it "
            "with `loopscale eval`)",
            value=str(run_dir),
        )
    if out.exists() and any(p.name not in (locks.LOCK, locks.TAKEOVER) for p in out.iterdir()) and not overwrite:
        raise ConfigError("OUT", "exists and is not empty; give --overwrite to replace its files", value=str(out))
    tok_json, bos, bos_id = _tokenizer_files(cfg)
    try:
        with locks.held(out, field="OUT", doing="a second export", executor="loopscale export"):
            _write_hf(out, model, cfg, run_dir, tok_json, bos, bos_id)
    finally:
        (out / locks.TAKEOVER).unlink(missing_ok=True)  # an HF folder holds only what it loads
    return out


def _write_hf(out: Path, model: Any, cfg: Any, run_dir: Path, tok_json: str, bos: str, bos_id: int) -> None:
    from safetensors.torch import save

    from loopscale.io import atomic_write_bytes, atomic_write_text
    from loopscale.train.checkpoint import CONFIG
    from loopscale.train.rundir import read_result

    # every file goes through a temporary file and a rename: a symlink in OUT is replaced, never written through
    atomic_write_bytes(out / "model.safetensors", save(unpadded_state_dict(model), metadata={"format": "pt"}))
    atomic_write_text(out / "config.json", json.dumps(hf_config(cfg, bos_id=bos_id), indent=2) + "\n")
    atomic_write_text(out / "tokenizer.json", _with_bos(tok_json, bos, bos_id))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": bos,
        "add_bos_token": True,
        "model_max_length": cfg.model.seq_len,
        "clean_up_tokenization_spaces": False,
    }
    atomic_write_text(out / "tokenizer_config.json", json.dumps(tok_cfg, indent=2) + "\n")
    atomic_write_text(out / "special_tokens_map.json", json.dumps({"bos_token": bos, "eos_token": bos}) + "\n")
    atomic_write_text(
        out / "generation_config.json",
        json.dumps({"bos_token_id": bos_id, "eos_token_id": bos_id, "do_sample": False}) + "\n",
    )
    atomic_write_bytes(out / MODELING, (resources.files("loopscale.export") / MODELING).read_bytes())
    atomic_write_bytes(out / "loopscale_config.toml", (run_dir / CONFIG).read_bytes())
    atomic_write_text(out / "README.md", model_card(cfg, run_dir, read_result(run_dir)))
