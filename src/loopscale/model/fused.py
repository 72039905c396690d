"""The block's memory-bound parts as autograd functions with hand-written backward passes (CPU).

On a CPU every elementwise pass over a [rows, d] activation costs about as much memory traffic as the
arithmetic, and autograd's decompositions make many of them: ``F.rms_norm`` with a gradient runs as
pow, mean, add, rsqrt and two broadcast products, and backward as about ten more passes; RoPE as four
half-width products, a sum, a difference and a concatenation; selecting q, k and v from the fused
projection adds a zero-filled [B, T, 3, H, hd] gradient per slice. The functions below compute the
same mathematics in fewer passes (``bench/RESULTS.md``, issue 20: a step's elementwise time drops by a
quarter to a third at d = 128; steps at the demo's widths run 1.0-1.17x faster). They are used on CPU in
fp32/fp64 outside autocast and compilation (``use_fused``); elsewhere ``layers.py`` keeps the plain ops,
which CUDA's fused kernels and ``torch.compile`` already serve well. ``tests/test_model_fused.py`` checks
values and gradients against the plain path and with ``gradcheck``. In fp32 their elementwise work runs in
``cpu_kernels.c`` (one pass per direction, compiled on first use) when a C compiler is there, and in the
torch ops below otherwise (``tests/test_model_cpu_kernels.py`` holds the two against each other). With the
kernels, causal attention runs there too (``rope_qk_norm_attention``), in place of torch's CPU SDPA.

The forward values are the plain path's up to rounding (the norms' scale is computed as
``rsqrt(|x|^2 / n + eps)``, RoPE as a complex product); the normalisation and rotation formulas are
arXiv 2604.21106 §2's (RoPE, then a parameter-free QK RMSNorm).
"""

from __future__ import annotations

import torch

from loopscale.model import cpu_kernels
from loopscale.model.chunks import mlp_chunk_rows

#: turn the fused CPU functions off (tests and ``bench/`` compare both paths)
ENABLED = True


def use_fused(x: torch.Tensor) -> bool:
    """Whether the CPU functions below serve ``x``: CPU, fp32/fp64, no autocast, not inside
    ``torch.compile`` (inductor fuses the plain ops itself)."""
    return (
        ENABLED
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
    )


def inv_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(mean(x^2) + eps) over the last dimension, kept as [..., 1]: one read of x."""
    n = x.size(-1)
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(n).add_(eps).rsqrt_()


class _RMSNorm(torch.autograd.Function):
    """y = x * rstd * w: one reduction and two products forward (``F.rms_norm`` on CPU is a composite of
    six ops), and backward in six passes over x instead of autograd's decomposition."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        if cpu_kernels.serves(x, x.size(-1), cpu_kernels.MAX_NORM_WIDTH):  # one pass (cpu_kernels.c)
            x = x.contiguous()
            y, rstd = cpu_kernels.rms_norm_fwd(x, w, eps)
        else:
            rstd = inv_rms(x, eps)
            y = torch.mul(x, rstd).mul_(w)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        x, w, rstd = ctx.saved_tensors
        n = x.size(-1)
        if cpu_kernels.serves(x, n, cpu_kernels.MAX_NORM_WIDTH):
            gx, dw = cpu_kernels.rms_norm_bwd(g.contiguous(), x, w, rstd, ctx.needs_input_grad[1])
            return gx, dw, None
        x_hat = x * rstd
        gx_hat = g * x_hat  # dL/dw per row; its product with w is each row's <g w, x_hat>
        dw = gx_hat.reshape(-1, n).sum(0) if ctx.needs_input_grad[1] else None
        c = (gx_hat @ w).unsqueeze(-1).div_(n)
        gx = torch.mul(g, w).mul_(rstd).addcmul_(x_hat, c.mul_(rstd), value=-1.0)
        return gx, dw, None


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return _RMSNorm.apply(x, w, eps)


def _pairs(x: torch.Tensor) -> torch.Tensor:
    """The complex view of a real [..., hd] tensor whose rotary pairs are adjacent."""
    return torch.view_as_complex(x.unflatten(-1, (x.size(-1) // 2, 2)))


def interleaved_qkv(w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[q; k; v] as one weight, with each head's rotary pairs (i, hd/2 + i) of q and k on adjacent rows:
    rows h hd + i and h hd + hd/2 + i become rows h hd + 2i and h hd + 2i + 1 (v's rows unchanged).

    Attention only ever sees q . k, and the QK-norm is a norm over the whole head, so q and k computed
    in this order give the same attention as the paper's half-split layout; the rotation is then one
    complex product per pair instead of four half-width products, a sum, a difference and a concatenation.
    One concatenation of transposed views (a single copy, as the plain path's ``torch.cat``), not an index.
    """
    d_out, d_in = w_q.shape
    heads, half = d_out // head_dim, head_dim // 2

    def paired(w: torch.Tensor) -> torch.Tensor:  # rows (h, i, j) <- (h, j, i)
        return w.view(heads, 2, half, d_in).transpose(1, 2)

    v = w_v.view(heads, half, 2, d_in)  # v's rows in their own order
    return torch.cat((paired(w_q), paired(w_k), v)).view(3 * d_out, d_in)


def _kernels_serve(qkv: torch.Tensor) -> bool:
    return cpu_kernels.serves(qkv, qkv.size(-1), cpu_kernels.MAX_HEAD_DIM) and qkv.size(-2) <= cpu_kernels.MAX_HEADS


class _RopeQKNorm(torch.autograd.Function):
    """q, k, v from the fused projection [B, T, 3, H, hd] whose q and k rows are in ``interleaved_qkv``
    order: RoPE as a complex product, then a parameter-free RMSNorm on q and k, v as is; the gradient is
    written straight into one [B, T, 3, H, hd] tensor. ``packed``: the output as that one tensor (for
    ``_CausalAttention``), else as three [B, T, H, hd] views."""

    @staticmethod
    def forward(
        ctx,
        qkv: torch.Tensor,
        turn: torch.Tensor,
        eps: float,  # type: ignore[override]
        packed: bool = False,
    ):
        if _kernels_serve(qkv):  # one pass (cpu_kernels.c)
            out, rstd = cpu_kernels.rope_qk_norm_fwd(qkv.contiguous(), turn, eps)
        else:
            # (x1, x2) -> (x1 cos + x2 sin, x2 cos - x1 sin) is (x1 + i x2)(cos - i sin)
            out = torch.empty_like(qkv, memory_format=torch.contiguous_format)
            y = out[:, :, :2]
            torch.mul(_pairs(qkv[:, :, :2]), turn[:, None, None], out=_pairs(y))  # [T,1,1,hd/2] on [B,T,2,H,hd/2]
            rstd = inv_rms(y, eps)
            y.mul_(rstd)
            out[:, :, 2].copy_(qkv[:, :, 2])
        ctx.save_for_backward(out, rstd, turn)
        ctx.packed = packed
        return out if packed else (out[:, :, 0], out[:, :, 1], out[:, :, 2])

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):  # type: ignore[override]
        out, rstd, turn = ctx.saved_tensors
        gq, gk, gv = (grads[0][:, :, 0], grads[0][:, :, 1], grads[0][:, :, 2]) if ctx.packed else grads
        if _kernels_serve(out):
            return cpu_kernels.rope_qk_norm_bwd(gq, gk, gv, out, rstd, turn), None, None, None
        grad = torch.empty_like(out)
        back = turn.conj()[:, None]  # the rotation's transpose, cos + i sin: [T, 1, hd/2] on [B, T, H, hd/2]
        for j, gy in enumerate((gq, gk)):
            y = out[:, :, j]
            c = (gy * y).sum(-1, keepdim=True).div_(y.size(-1))
            gx = torch.addcmul(gy, y, c, value=-1.0).mul_(rstd[:, :, j])  # the norm's backward
            if gx.stride(-1) != 1:  # gradients laid out by SDPA's math backend: pairs must be adjacent
                gx = gx.contiguous()
            torch.mul(_pairs(gx), back, out=_pairs(grad[:, :, j]))
        grad[:, :, 2].copy_(gv)
        return grad, None, None, None


def rope_qk_norm(qkv: torch.Tensor, turn: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as [B, T, H, hd] from ``qkv`` [B, T, 3, H, hd] (q and k rows in ``interleaved_qkv`` order);
    ``turn`` = cos - i sin, [T, hd/2] for its positions (``Rotary.turn``). q and k come out in
    ``interleaved_qkv`` order too."""
    return _RopeQKNorm.apply(qkv, turn, eps)


class _CausalAttention(torch.autograd.Function):
    """Causal SDPA (scale 1/sqrt(hd)) on the packed output of ``rope_qk_norm``, in ``cpu_kernels.c``: the
    output comes out as [B, T, H * hd] (the out projection's input, no transpose copy) and the gradient goes
    back as one [B, T, 3, H, hd] tensor. Keeps what the flash kernels keep: q, k, v (the packed tensor,
    already saved by ``rope_qk_norm``), the output and each query row's log-sum-exp."""

    @staticmethod
    def forward(ctx, qkv: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        B, T, _, H, hd = qkv.shape
        ctx.scale = hd**-0.5
        qkv = qkv.contiguous()
        y, lse = cpu_kernels.attention_fwd(qkv, ctx.scale)
        ctx.save_for_backward(qkv, y, lse)
        return y.view(B, T, H * hd)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        qkv, y, lse = ctx.saved_tensors
        return cpu_kernels.attention_bwd(qkv, y, lse, g.view(y.shape), ctx.scale)


def attention_kernel_serves(qkv: torch.Tensor) -> bool:
    """Whether ``rope_qk_norm_attention`` runs ``qkv`` [B, T, 3, H, hd] (fp32 CPU with the compiled kernels,
    hd a multiple of 16, SDPA's flash backend not switched off); otherwise the caller runs SDPA."""
    return _kernels_serve(qkv) and cpu_kernels.attention_serves(qkv)


def rope_qk_norm_attention(qkv: torch.Tensor, turn: torch.Tensor, eps: float) -> torch.Tensor:
    """``rope_qk_norm`` then causal self-attention of its q, k, v, [B, T, H * hd], all in ``cpu_kernels.c``
    (callers check ``attention_kernel_serves(qkv)``)."""
    return _CausalAttention.apply(_RopeQKNorm.apply(qkv, turn, eps, True))


def squared_relu_grad(g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """d/dz relu(z)^2 applied to ``g``, from h = relu(z): 0 + 2 g h in one pass over a broadcast zero,
    bitwise (g h) * 2 (doubling is exact) without a second pass for the doubling. Every device uses it."""
    return torch.addcmul(g.new_zeros(()).expand_as(g), g, h, value=2.0)


class _SquaredReLUMLP(torch.autograd.Function):
    """proj(relu(fc x)^2) by row chunks; keeps relu(fc x) only (the square is recomputed per chunk).

    Unchunked, each [rows, 4d] elementwise pass (the relu, the square, the gradient 2 g h) streams the
    block's widest activation through DRAM, and autograd keeps both h and h^2. Chunk by chunk they stay
    in cache; the weight gradients are summed over the chunks.
    """

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        w_fc: torch.Tensor,
        w_proj: torch.Tensor,  # type: ignore[override]
        chunk: int,
    ) -> torch.Tensor:
        rows = x.reshape(-1, x.size(-1))
        h = rows.new_empty(rows.size(0), w_fc.size(0))
        out = rows.new_empty(rows.size(0), w_proj.size(0))
        # with the compiled kernels, relu and square in one pass into a buffer reused by every chunk
        square = rows.new_empty(min(chunk, rows.size(0)), h.size(1)) if cpu_kernels.serves(rows) else None
        for lo in range(0, rows.size(0), chunk):
            hc = torch.mm(rows[lo : lo + chunk], w_fc.t(), out=h[lo : lo + chunk])
            if square is None:
                sq = hc.clamp_(min=0) * hc
            else:
                sq = square[: hc.size(0)]
                cpu_kernels.relu_square_fwd(hc, sq)
            torch.mm(sq, w_proj.t(), out=out[lo : lo + chunk])
        ctx.save_for_backward(rows, h, w_fc, w_proj)
        ctx.chunk = chunk
        return out.view(*x.shape[:-1], w_proj.size(0))

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        rows, h, w_fc, w_proj = ctx.saved_tensors
        want_x, want_fc, want_proj, _ = ctx.needs_input_grad
        grads = g.reshape(-1, g.size(-1))
        gx = torch.empty_like(rows) if want_x else None
        g_fc: torch.Tensor | None = None
        g_proj: torch.Tensor | None = None
        bufs = None
        if cpu_kernels.serves(h):  # 2 g h and h^2 in one pass, into two buffers reused by every chunk
            bufs = h.new_empty(2, min(ctx.chunk, h.size(0)), h.size(1))
        for lo in range(0, rows.size(0), ctx.chunk):
            hc, gc = h[lo : lo + ctx.chunk], grads[lo : lo + ctx.chunk]
            if bufs is None:
                sq = hc * hc if want_proj else None
                gz = squared_relu_grad(gc @ w_proj, hc)
            else:
                sq, gz = bufs[0, : hc.size(0)], torch.mm(gc, w_proj, out=bufs[1, : hc.size(0)])
                cpu_kernels.relu_square_bwd(hc, gz, sq)
            if want_proj:
                assert sq is not None  # computed above whenever proj's gradient is wanted
                g_proj = _accumulate(g_proj, gc.t() @ sq)
            if want_fc:
                g_fc = _accumulate(g_fc, gz.t() @ rows[lo : lo + ctx.chunk])
            if gx is not None:
                torch.mm(gz, w_fc, out=gx[lo : lo + ctx.chunk])
        return (gx.view(*g.shape[:-1], rows.size(1)) if gx is not None else None), g_fc, g_proj, None


def _accumulate(total: torch.Tensor | None, part: torch.Tensor) -> torch.Tensor:
    """A weight gradient summed over chunks (a plain matmul per chunk, as the FLOP counter sees it)."""
    return part if total is None else total.add_(part)


def squared_relu_mlp(
    x: torch.Tensor, w_fc: torch.Tensor, w_proj: torch.Tensor, chunk: int | None = None
) -> torch.Tensor:
    """The block's MLP, ``relu(x w_fc^T)^2 w_proj^T``, by row chunks (default: ``mlp_chunk_rows``)."""
    return _SquaredReLUMLP.apply(x, w_fc, w_proj, chunk or mlp_chunk_rows(w_fc.size(0)))
