"""Read models of the paper's own code (arXiv 2604.21106; github kschwethelm/looped-lm-scaling, a nanochat
fork) into loopscale: its ``GPTConfig`` as a :class:`~loopscale.config.ModelConfig`, its ``state_dict``
under loopscale's parameter names.

The two models compute the same function (``tests/test_parity.py`` pins logits, learning rates and the
first optimiser steps against numbers the paper's code produced), so a checkpoint trained by the paper's
code can be evaluated, sampled or fine-tuned with loopscale. Names map one to one::

    transformer.wte / lm_head                         embed / head
    transformer.{prelude,recur,coda}.i.attn.c_{q,k,v,proj}   {prelude,recur,coda}.i.attn.{q,k,v,out}
    transformer.{...}.i.mlp.c_fc / .mlp.c_proj       {...}.i.mlp.fc / .mlp.proj
    transformer.{...}.i.n1 / .n3                     {...}.i.norm1 / .norm2
    inject                                           inject (the linear injection)
    lane_alpha / lane_mixing / lane_beta             inject.alpha / inject.mix / inject.beta
    norm_emb / norm_recur / norm_final               the same
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from loopscale.errors import ConfigError

INJECTION_NAMES = {
    "inject_init_prelude": "linear",
    "passthrough": "passthrough",
    "additive": "additive",
    "hyperconnect": "hyperconnect",
}

_BLOCK = re.compile(r"^transformer\.(prelude|recur|coda)\.(\d+)\.(.+)$")
_BLOCK_PARTS = {
    "attn.c_q": "attn.q",
    "attn.c_k": "attn.k",
    "attn.c_v": "attn.v",
    "attn.c_proj": "attn.out",
    "mlp.c_fc": "mlp.fc",
    "mlp.c_proj": "mlp.proj",
    "n1": "norm1",
    "n3": "norm2",
}
_TOP = {
    "transformer.wte.weight": "embed.weight",
    "lm_head.weight": "head.weight",
    "lane_alpha": "inject.alpha",
    "lane_mixing": "inject.mix",
    "lane_beta": "inject.beta",
}


def model_config_from_paper(gpt_config: Mapping[str, Any]) -> dict[str, Any]:
    """ModelConfig fields for a paper ``GPTConfig`` (as its ``asdict``, e.g. a checkpoint's ``model_config``).

    The paper's model always has the recurrent-state norm, so its one-recurrence models are loops of one
    (``r1_looped``); full BPTT is ``bptt_k = None``.
    """
    cfg = dict(gpt_config)
    n_head, n_kv_head, d = int(cfg["n_head"]), int(cfg.get("n_kv_head", cfg["n_head"])), int(cfg["n_embd"])
    if n_kv_head != n_head:
        raise ConfigError("n_kv_head", f"grouped-query attention is not supported (n_head = {n_head})", value=n_kv_head)
    mode = cfg.get("input_injection", "inject_init_prelude")
    if mode not in INJECTION_NAMES:
        raise ConfigError("input_injection", f"expected one of {sorted(INJECTION_NAMES)}", value=mode)
    r = int(cfg["num_recur"])
    bptt_k = cfg.get("bptt_k")
    return {
        "vocab_size": int(cfg["vocab_size"]),
        "d_model": d,
        "head_dim": d // n_head,
        "n_prelude": int(cfg["n_prelude"]),
        "n_coda": int(cfg["n_coda"]),
        "L_eff": int(cfg["n_prelude"]) + r * int(cfg["n_recur_block"]) + int(cfg["n_coda"]),
        "r": r,
        "r1_looped": r == 1,
        "seq_len": int(cfg["sequence_len"]),
        "injection": INJECTION_NAMES[mode],
        "hc_lanes": int(cfg.get("num_lanes", 2)),
        "bptt_k": None if bptt_k is None or int(bptt_k) >= r else int(bptt_k),
        "softcap": cfg.get("logit_softcap", 15.0),
    }


def state_dict_from_paper(state: Mapping[str, Any]) -> dict[str, Any]:
    """The paper model's ``state_dict`` under loopscale's names (values untouched; ``_orig_mod.`` stripped)."""
    out: dict[str, Any] = {}
    for name, value in state.items():
        key = name.removeprefix("_orig_mod.")
        if key in _TOP:
            new = _TOP[key]
        elif m := _BLOCK.match(key):
            part, _, leaf = m.group(3).rpartition(".")
            if part not in _BLOCK_PARTS:
                raise ConfigError("state_dict", "unknown block parameter of the paper's model", value=name)
            new = f"{m.group(1)}.{m.group(2)}.{_BLOCK_PARTS[part]}.{leaf}"
        elif key in ("inject.weight", "norm_emb.weight", "norm_recur.weight", "norm_final.weight"):
            new = key
        else:
            raise ConfigError("state_dict", "unknown parameter of the paper's model", value=name)
        out[new] = value
    return out
