"""The head, softcap and cross-entropy in one pass over row chunks (arXiv 2604.21106 §2's loss, fused).

The plain path materialises fp32 logits over the whole micro-batch, and autograd keeps tanh's and
log-softmax's outputs (8V bytes per token, more than a whole block at the paper's V = 32001 and
s <= 12). Here the head's matmul, the softcap and the cross-entropy run on ``chunk`` rows at a time and
their gradients are computed in the same pass (as Liger-Kernel's fused linear cross-entropy does), so
only one chunk's logits ever exist and backward is two scalings. The arithmetic is the plain path's:
logits in the compute dtype (the head's matmul under autocast), then fp32 softcap and log-softmax over
the real vocabulary, gradients cast back to the compute dtype for the two matmuls of the head's
backward. ``tests/test_model.py`` compares both paths and their gradients.
"""

from __future__ import annotations

import torch

from loopscale.model.chunks import chunk_rows


class _FusedSoftcapCE(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        h: torch.Tensor,
        w: torch.Tensor,
        targets: torch.Tensor,
        softcap: float | None,
        chunk: int,
        dtype: torch.dtype,
        mean: bool,
        graph: bool,
    ) -> torch.Tensor:  # type: ignore[override]
        # under no_grad apply() still reports the inputs' requires_grad (and forward itself always runs
        # without grad mode): the caller says whether a graph is being built
        want_h, want_w = graph and ctx.needs_input_grad[0], graph and ctx.needs_input_grad[1]
        wc = w.to(dtype)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        grad_h = torch.empty_like(h) if want_h else None
        grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if want_w else None
        n_valid = (targets != -1).sum()
        scale = 1.0 / n_valid.clamp(min=1).float() if mean else torch.ones((), device=h.device)
        for lo in range(0, h.size(0), chunk):
            # in place where the plain path would allocate: a chunk holds two [rows, V] fp32 tensors
            hc = h[lo : lo + chunk].to(dtype)
            t = targets[lo : lo + chunk]
            keep = t != -1
            z = (hc @ wc.t()).float()
            if softcap is not None:
                th = z.div_(softcap).tanh_()
                z = th * softcap
            tgt = t.clamp(min=0).unsqueeze(1)
            z_t = z.gather(1, tgt).squeeze(1)
            top = z.amax(dim=-1, keepdim=True)
            g = z.sub_(top).exp_()  # log-sum-exp without logsumexp's own [rows, V] temporaries
            norm = g.sum(dim=-1, keepdim=True)
            total += ((top + norm.log()).squeeze(1) - z_t).mul_(keep).sum()
            if not (want_h or want_w):
                continue
            g.div_(norm)  # the softmax
            g.scatter_add_(1, tgt, torch.full_like(tgt, -1, dtype=g.dtype))
            g.mul_((keep.float() * scale).unsqueeze(1))
            if softcap is not None:
                g.mul_(th.mul_(th).neg_().add_(1.0))  # d softcap(x) / dx = 1 - tanh^2
            gc = g.to(dtype)
            if grad_h is not None:
                grad_h[lo : lo + chunk] = gc @ wc
            if grad_w is not None:
                grad_w += (gc.t() @ hc).float()
        ctx.save_for_backward(
            grad_h if grad_h is not None else torch.empty(0),
            grad_w.to(w.dtype) if grad_w is not None else torch.empty(0),
        )
        return total * scale

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        grad_h, grad_w = ctx.saved_tensors
        gh = grad_h * grad_out.to(grad_h.dtype) if ctx.needs_input_grad[0] else None
        gw = grad_w * grad_out.to(grad_w.dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None, None, None, None


def compute_dtype(device: torch.device, fallback: torch.dtype) -> torch.dtype:
    """The dtype the head's matmul runs in: autocast's when it is on, else the input's."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return fallback


def softcap_cross_entropy(
    h: torch.Tensor,
    w: torch.Tensor,
    targets: torch.Tensor,
    *,
    softcap: float | None,
    reduction: str = "mean",
    chunk: int | None = None,
) -> torch.Tensor:
    """Cross-entropy of ``softcap * tanh(h w^T / softcap)`` against ``targets`` (-1 ignored).

    ``h`` [N, d] is the normed final state, ``w`` [V, d] the head's rows of the *real* vocabulary.
    ``reduction`` "mean" (over non-ignored targets) or "sum"; per-token losses take the plain path.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"fused cross-entropy reduces by mean or sum, not {reduction!r}")
    dtype = compute_dtype(h.device, h.dtype)
    rows = chunk or chunk_rows(w.size(0), h.size(0))
    with torch.autocast(h.device.type, enabled=False):
        return _FusedSoftcapCE.apply(
            h, w, targets.reshape(-1), softcap, rows, dtype, reduction == "mean", torch.is_grad_enabled()
        )
