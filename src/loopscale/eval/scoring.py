"""Scoring a model on prompt -> continuation items (arXiv 2604.21106 §6): the loss of the gold
continuation, greedy decoding, and answer matching.

    nll(item) = - sum_t log p(gold_t | BOS, prompt, gold_<t)      nats; per token: nll / len(gold)

* Prompt and gold are tokenised **separately** (``[BOS] + encode(prompt)`` and ``encode(gold)``),
  so a BPE merge never straddles the boundary; the gold's leading space belongs to the gold, as in
  lm-evaluation-harness. BOS comes first because every training row starts with BOS.
* Only the gold tokens are scored. The softmax runs over the tokenizer's vocabulary
  (``model.cfg.vocab_size``): the ids the model pads its head with are never a real token.
* Batches are right-padded; attention is causal, so padding after a row's last token cannot change
  its scores (tested: batch size and padding leave every score unchanged to float precision).
* A sequence longer than the model's ``seq_len`` loses prompt tokens from the left (BOS stays first,
  as for a cropped training row); ``Continuation.truncated`` counts them. A gold longer than
  ``seq_len`` on its own keeps its last ``seq_len`` tokens scored, the rest becomes context.
* Items are processed longest first (little padding) and returned in input order; the result does
  not depend on the batch size. ``r`` may differ from the training r (test-time recurrence).

The model needs only ``model(idx, r=..., cache=...) -> logits [B, T, >= vocab]`` and ``model.cfg``
with ``vocab_size`` and ``seq_len`` (``LoopedLM`` has both), so toy models can be scored as well.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from loopscale.data.tokenizer import Tokenizer
from loopscale.errors import ConfigError

Progress = Callable[[int], None] | None  # called with the number of sequences just finished


@dataclass(frozen=True)
class Continuation:
    """The score of one gold continuation."""

    nll: float  # total negative log-likelihood of the scored gold tokens (nats)
    n_tokens: int  # gold tokens scored
    n_bytes: int  # UTF-8 bytes of the gold
    greedy: bool  # greedy decoding would produce exactly these tokens (lm-eval's is_greedy)
    truncated: int = 0  # tokens dropped from the left to fit seq_len

    @property
    def loss(self) -> float:
        """Mean loss per gold token (nats)."""
        return self.nll / self.n_tokens


def model_device(model: Any) -> torch.device:
    params = getattr(model, "parameters", None)
    p = next(iter(params()), None) if callable(params) else None
    return p.device if p is not None else torch.device("cpu")


def _vocab(model: Any, tokenizer: Tokenizer) -> int:
    return int(getattr(model.cfg, "vocab_size", tokenizer.vocab_size))


def _max_len(model: Any, max_len: int | None) -> int:
    n = int(max_len or model.cfg.seq_len)
    if n < 2:
        raise ConfigError("max_len", "must allow at least two tokens", value=n)
    return n


def encode_pair(tokenizer: Tokenizer, prompt: str, gold: str, max_len: int) -> tuple[list[int], int, int]:
    """``(tokens, n_context, truncated)``: ``tokens[:n_context]`` is BOS + prompt, the rest the gold;
    ``len(tokens) - 1 <= max_len`` (the model reads every token but the last)."""
    ctx = [tokenizer.bos_id, *tokenizer.encode(prompt)]
    cont = tokenizer.encode(gold)
    if not cont:
        raise ConfigError("gold", "empty continuation; every item needs a non-empty gold answer", value=gold)
    excess = len(ctx) + len(cont) - 1 - max_len
    if excess <= 0:
        return ctx + cont, len(ctx), 0
    if len(ctx) - excess >= 1:  # drop prompt tokens after BOS
        return [ctx[0], *ctx[1 + excess :], *cont], len(ctx) - excess, excess
    seq = (ctx + cont)[-(max_len + 1) :]  # the gold alone is too long: its head becomes context
    return seq, 1, len(ctx) + len(cont) - len(seq)


@torch.no_grad()
def score_continuations(
    model: Any,
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    *,
    r: int | None = None,
    batch_size: int = 32,
    max_len: int | None = None,
    progress: Progress = None,
) -> list[Continuation]:
    """Score ``(prompt, gold)`` pairs: loss of each gold given BOS + its prompt, in input order."""
    n_max = _max_len(model, max_len)
    enc = [encode_pair(tokenizer, p, g, n_max) for p, g in pairs]
    scored = score_tokens(
        model,
        [(seq, n_ctx) for seq, n_ctx, _ in enc],
        vocab=_vocab(model, tokenizer),
        r=r,
        batch_size=batch_size,
        progress=progress,
    )
    return [
        Continuation(nll, len(seq) - n_ctx, len(g.encode("utf-8")), greedy, cut)
        for (nll, greedy), (seq, n_ctx, cut), (_, g) in zip(scored, enc, pairs, strict=True)
    ]


@torch.no_grad()
def score_tokens(
    model: Any,
    seqs: Sequence[tuple[Sequence[int], int]],
    *,
    vocab: int,
    r: int | None = None,
    batch_size: int = 32,
    progress: Progress = None,
) -> list[tuple[float, bool]]:
    """The token-level scorer: for each ``(tokens, n_context)``, the NLL (nats) of ``tokens[n_context:]``
    given the tokens before them, and whether greedy decoding reproduces them. The model reads
    ``tokens[:-1]``; sequences are batched longest first, right-padded, returned in input order."""
    if batch_size < 1:
        raise ConfigError("batch_size", "must be positive", value=batch_size)
    for seq, n_ctx in seqs:
        if not 1 <= n_ctx < len(seq):
            raise ConfigError("tokens", "need at least one context and one scored token", value=(len(seq), n_ctx))
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    device = model_device(model)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i][0]))  # stable: ties keep input order
    out: list[tuple[float, bool]] = [(0.0, False)] * len(seqs)
    for lo in range(0, len(order), batch_size):
        idx = order[lo : lo + batch_size]
        T = len(seqs[idx[0]][0]) - 1
        x = torch.zeros(len(idx), T, dtype=torch.long)
        rows, cols, tgt = [], [], []
        for b, i in enumerate(idx):
            seq, n_ctx = seqs[i]
            x[b, : len(seq) - 1] = torch.as_tensor(list(seq[:-1]))
            for t in range(n_ctx - 1, len(seq) - 1):  # logits at t predict token t + 1
                rows.append(b)
                cols.append(t)
                tgt.append(int(seq[t + 1]))
        logits = model(x.to(device), r=r)
        rows_t, cols_t = torch.tensor(rows, device=device), torch.tensor(cols, device=device)
        sel = logits[rows_t, cols_t, :vocab].float()
        tgt_t = torch.tensor(tgt, device=device)
        lp = torch.log_softmax(sel.double(), dim=-1).gather(1, tgt_t[:, None])[:, 0]
        nll = torch.zeros(len(idx), dtype=torch.float64, device=device).index_add_(0, rows_t, -lp)
        miss = torch.zeros(len(idx), dtype=torch.long, device=device).index_add_(
            0, rows_t, (sel.argmax(dim=-1) != tgt_t).long()
        )
        for b, (v, m) in enumerate(zip(nll.cpu().tolist(), miss.cpu().tolist(), strict=True)):
            out[idx[b]] = (v, m == 0)
        if progress is not None:
            progress(len(idx))
    if was_training and hasattr(model, "train"):
        model.train()
    return out


@torch.no_grad()
def greedy_generate(
    model: Any,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    *,
    max_new_tokens: int | Sequence[int],
    until: Sequence[str] = ("\n",),
    r: int | None = None,
    batch_size: int = 32,
    max_len: int | None = None,
    progress: Progress = None,
) -> list[str]:
    """Greedy continuations of BOS + prompt, cut before the first ``until`` string.

    Generation also stops at BOS (a document boundary in training) and after ``max_new_tokens``
    (one number, or one per prompt). Batched with the looped KV cache: prompts of different
    lengths are fed token by token past the shortest one, so every row sees exactly its own
    prompt (no padding inside the sequence); batches group prompts of similar length. The argmax
    runs over the real vocabulary only.
    """
    from loopscale.model import KVCache

    if batch_size < 1:
        raise ConfigError("batch_size", "must be positive", value=batch_size)
    limits = [int(max_new_tokens)] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(limits) != len(prompts) or any(m < 1 for m in limits):
        raise ConfigError("max_new_tokens", "need one positive limit per prompt", value=max_new_tokens)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    n_max = _max_len(model, max_len)
    V = _vocab(model, tokenizer)
    device = model_device(model)
    stops = {tokenizer.bos_id}
    eos = getattr(tokenizer, "eos_id", None)
    if eos is not None:
        stops.add(int(eos))
    ctxs = []
    for p, m in zip(prompts, limits, strict=True):
        ctx = [tokenizer.bos_id, *tokenizer.encode(p)]
        room = max(n_max - m, 1)
        ctxs.append(ctx if len(ctx) <= room else [ctx[0], *ctx[len(ctx) - room + 1 :]])
    order = sorted(range(len(ctxs)), key=lambda i: len(ctxs[i]))
    # Batches of similar prompt length: a row longer than the batch's shortest is fed its extra
    # prompt tokens one step at a time, so the spread is kept within the generation length.
    batches: list[list[int]] = []
    for i in order:
        last = batches[-1] if batches else None
        if last is None or len(last) >= batch_size or len(ctxs[i]) - len(ctxs[last[0]]) > max(8, max(limits)):
            batches.append([i])
        else:
            last.append(i)
    texts: list[str] = [""] * len(ctxs)
    for idx in batches:
        lens = [len(ctxs[i]) for i in idx]
        start = min(lens)
        cache = KVCache()
        x = torch.tensor([ctxs[i][:start] for i in idx], dtype=torch.long, device=device)
        nxt = model(x, r=r, cache=cache)[:, -1, :V].argmax(dim=-1).tolist()
        gen: list[list[int]] = [[] for _ in idx]
        done = [False] * len(idx)
        pos = start
        while True:
            feed = []
            for b, i in enumerate(idx):
                if pos < lens[b]:
                    feed.append(ctxs[i][pos])
                    continue
                tok = nxt[b]
                feed.append(tok)
                if not done[b]:
                    if tok in stops:
                        done[b] = True
                        continue
                    gen[b].append(tok)
                    text = tokenizer.decode(gen[b])
                    if len(gen[b]) >= limits[i] or any(u and u in text for u in until):
                        done[b] = True
            if all(done):
                break
            feed_t = torch.tensor(feed, dtype=torch.long, device=device)[:, None]
            nxt = model(feed_t, r=r, cache=cache)[:, -1, :V].argmax(dim=-1).tolist()
            pos += 1
        for b, i in enumerate(idx):
            texts[i] = cut_at(tokenizer.decode(gen[b]), until)
        if progress is not None:
            progress(len(idx))
    if was_training and hasattr(model, "train"):
        model.train()
    return texts


def cut_at(text: str, until: Sequence[str]) -> str:
    """``text`` up to (not including) the first occurrence of any ``until`` string."""
    cut = len(text)
    for u in until:
        if u:
            j = text.find(u)
            if j >= 0:
                cut = min(cut, j)
    return text[:cut]


# ---- answer matching ---------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = str.maketrans("", "", string.punctuation)
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")


def normalize(text: str, mode: str = "exact") -> str:
    """How a prediction and a gold answer are compared.

    ``exact``: surrounding whitespace only (symbolic and world tasks, where punctuation matters);
    ``squad``: SQuAD's normalisation — lower case, no punctuation, no articles, single spaces;
    ``number``: a number in canonical form (``27.0`` -> ``27``, ``1,200`` -> ``1200``), else ``exact``.
    """
    if mode == "exact":
        return text.strip()
    if mode == "squad":
        t = _ARTICLES.sub(" ", text.lower().translate(_PUNCT))
        return " ".join(t.split())
    if mode == "number":
        t = text.strip().replace(",", "").rstrip(".").removeprefix("$")
        if _NUMBER.match(t):
            v = float(t)
            return str(int(v)) if v == int(v) else repr(v)
        return text.strip()
    raise ConfigError("match", "unknown answer normalisation; expected exact, squad or number", value=mode)


def is_match(prediction: str, answers: Sequence[str], mode: str = "exact") -> bool:
    """True when the normalised prediction equals any normalised answer."""
    p = normalize(prediction, mode)
    return any(p == normalize(a, mode) for a in answers)
