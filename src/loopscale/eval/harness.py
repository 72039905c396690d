"""lm-evaluation-harness adapter: a loopscale checkpoint as an ``lm_eval`` model named ``loopscale``.

Needs the ``[eval]`` extra (``pip install -e '.[eval]'``). Importing this module registers the
model class, after which every harness task runs on loopscale models::

    import lm_eval, loopscale.eval.harness  # noqa: F401  (registers "loopscale")
    lm_eval.simple_evaluate(model="loopscale", model_args="pretrained=runs/r4,r=8", tasks=["lambada_openai"])

    # or with a model in memory
    lm_eval.simple_evaluate(model=LoopscaleLM(model=m, tokenizer=ByteTokenizer()), tasks=[...])

Requests go through loopscale's own scorer (``loopscale.eval.scoring``), so the harness sees
exactly the numbers ``loopscale eval`` computes: ``loglikelihood`` returns ``(-nll, is_greedy)``
of the continuation given BOS + context; ``loglikelihood_rolling`` scores a whole text in
disjoint windows of ``seq_len`` tokens after BOS (lm-eval's rolling windows); ``generate_until``
is greedy decoding (``do_sample=True`` with a temperature > 0 is refused) cut at the first stop
string. ``r`` sets the recurrences used at test time (default: the training r).
"""

from __future__ import annotations

from typing import Any

import lm_eval.models  # noqa: F401  (fills lm-eval's lazy model registry before we add to it)
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from loopscale.errors import ConfigError
from loopscale.eval.scoring import greedy_generate, score_continuations, score_tokens


def _opt_int(v: Any, name: str) -> int | None:
    if v is None or v == "" or (isinstance(v, str) and v.lower() in ("none", "auto")):
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ConfigError(name, "expected a whole number", value=v) from None


@register_model("loopscale")
class LoopscaleLM(LM):
    """A loopscale model for lm-eval: ``pretrained`` is a run dir (or its model.safetensors)."""

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        r: int | str | None = None,
        batch_size: int | str | None = 32,
        device: str | None = None,
        max_length: int | str | None = None,
        **_: Any,
    ) -> None:
        super().__init__()
        if model is None:
            if pretrained is None:
                raise ConfigError("pretrained", "give a run dir (model_args='pretrained=RUN_DIR') or model=")
            from loopscale.eval.runs import resolve_device, tokenizer_for
            from loopscale.train.checkpoint import load_model

            model, cfg = load_model(pretrained, device=resolve_device(device or "cpu"))
            tokenizer = tokenizer or tokenizer_for(cfg)
        if tokenizer is None:
            from loopscale.data.tokenizer import ByteTokenizer

            tokenizer = ByteTokenizer()
        self.model = model.eval()
        self.tok = tokenizer
        self.r = _opt_int(r, "r")
        self.batch_size = _opt_int(batch_size, "batch_size") or 32
        self.max_length = _opt_int(max_length, "max_length") or int(model.cfg.seq_len)

    # ---- lm-eval API -------------------------------------------------------------------------
    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        pairs = [(str(req.args[0]), str(req.args[1])) for req in requests]
        scores = score_continuations(
            self.model, self.tok, pairs, r=self.r, batch_size=self.batch_size, max_len=self.max_length
        )
        out = [(-s.nll, s.greedy) for s in scores]
        for req, ans in zip(requests, out, strict=True):
            self.cache_hook.add_partial("loglikelihood", req.args, ans)
        return out

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        seqs: list[tuple[list[int], int]] = []
        owner: list[int] = []
        for i, req in enumerate(requests):
            tokens = self.tok.encode(str(req.args[0]))
            for ctx, pred in map(
                make_disjoint_window,
                get_rolling_token_windows(
                    tokens, prefix_token=self.tok.bos_id, max_seq_len=self.max_length, context_len=1
                ),
            ):
                seqs.append(([*ctx, *pred], len(ctx)))
                owner.append(i)
        scored = score_tokens(
            self.model, seqs, vocab=int(self.model.cfg.vocab_size), r=self.r, batch_size=self.batch_size
        )
        totals = [0.0] * len(requests)
        for i, (nll, _) in zip(owner, scored, strict=True):
            totals[i] -= nll
        for req, ans in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, ans)
        return totals

    def generate_until(self, requests: list[Any]) -> list[str]:
        groups: dict[tuple[tuple[str, ...], int], list[int]] = {}
        for i, req in enumerate(requests):
            kw: dict[str, Any] = dict(req.args[1] or {}) if len(req.args) > 1 else {}
            if kw.get("do_sample") and float(kw.get("temperature", 1.0) or 0.0) > 0:
                raise ConfigError(
                    "gen_kwargs", "loopscale generates greedily; set do_sample=false", value=kw.get("do_sample")
                )
            until = kw.get("until") or []
            until = (until,) if isinstance(until, str) else tuple(until)
            max_new = int(kw.get("max_gen_toks", kw.get("max_new_tokens", 256)))
            groups.setdefault((until, max_new), []).append(i)
        out = [""] * len(requests)
        for (until, max_new), idx in groups.items():
            texts = greedy_generate(
                self.model,
                self.tok,
                [str(requests[i].args[0]) for i in idx],
                max_new_tokens=max_new,
                until=until,
                r=self.r,
                batch_size=self.batch_size,
                max_len=self.max_length,
            )
            for i, t in zip(idx, texts, strict=True):
                out[i] = t
                self.cache_hook.add_partial("generate_until", requests[i].args, t)
        return out

    @property
    def tokenizer_name(self) -> str:
        return getattr(self.tok, "name", type(self.tok).__name__)
