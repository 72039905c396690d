"""A pack: k same-shaped ``LoopedLM`` runs trained as one stacked model (docs/training.md, "Packs").

Every parameter of the k members is one tensor ``[k, *shape]`` here; a member's own ``LoopedLM`` keeps its
parameters as views of its slice (``attach``), so its ``state_dict`` (checkpoints, weights), its validation and
its evaluation are the solo model's code on the pack's numbers. The forward mirrors ``LoopedLM.forward`` op by
op with a leading member dimension: the block matrices as batched matrix products (``torch.matmul`` of
``[k, rows, in]`` and ``[k, in, out]``), RoPE + QK-norm and causal attention on the members' rows together
(they act row by row, head by head: ``[k * B, T, 3, H, hd]`` is just more rows), the norms and the MLP's
elementwise passes per member slice or over all members, the fused loss per member. It returns one mean loss
per member; their sum back-propagates each member's own gradient (the members share no parameter).

How close a member is to its solo run: the C kernels and the elementwise ops compute each row or element as
the solo run does, and MKL's batched products give each member the bits of the solo product on the CPUs this
was measured on, so a packed member's losses are the solo run's bit for bit there (``tests/test_pack.py``
measures it). Nothing guarantees that: another BLAS, another instruction set (vector and scalar tails of an
elementwise loop round differently where an op fuses a multiply-add) or several threads may change the last
bits, and training then carries them like any rounding difference; the test bounds the gap by the run's own
rounding noise. A pack against the same pack (kill and resume) is bitwise.

Techniques: the built-in injections have batched forms below; a user's technique (``model.technique``) runs
under ``torch.vmap`` over the members' parameters when ``packable`` finds that works (its methods are plain
torch ops, it does not wrap the recurrent block); otherwise its runs train alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from loopscale.model import cpu_kernels, fused
from loopscale.model.chunks import chunk_rows, mlp_chunk_rows
from loopscale.model.injection import AdditiveInjection, HyperConnect, LinearInjection, Passthrough
from loopscale.model.layers import qk_norm, squared_relu
from loopscale.model.looped import LoopedLM
from loopscale.model.loss import compute_dtype
from loopscale.technique import Technique


def _key(name: str) -> str:
    return name.replace(".", "__")


def _bcast(w: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-member vector ``[k, n]`` viewed to broadcast over ``like`` ``[k, ..., n]``."""
    return w.view(w.size(0), *([1] * (like.dim() - 2)), w.size(-1))


def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``F.linear`` per member: x ``[k, ..., in]``, w ``[k, out, in]`` -> ``[k, ..., out]`` (one batched product of
    the members' row blocks, as the solo run's ``F.linear`` folds its rows into one product)."""
    k = x.size(0)
    y = torch.matmul(x.reshape(k, -1, x.size(-1)), w.transpose(1, 2))
    return y.view(*x.shape[:-1], w.size(1))


# ---- the fused CPU functions with a member dimension (``model/fused.py``'s arithmetic, per member) -----------------


class _PackedRMSNorm(torch.autograd.Function):
    """``fused._RMSNorm`` with a scale per member: the C kernel once per member slice (the solo run's call on
    the same rows: same bits, its dw partial sums included), or the same torch ops broadcast over the members."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        n = x.size(-1)
        if cpu_kernels.serves(x, n, cpu_kernels.MAX_NORM_WIDTH):
            x = x.contiguous()
            y, rstd = torch.empty_like(x), x.new_empty((*x.shape[:-1], 1))
            for m in range(x.size(0)):
                cpu_kernels.rms_norm_fwd(x[m], w[m], eps, out=(y[m], rstd[m]))
        else:
            rstd = fused.inv_rms(x, eps)
            y = torch.mul(x, rstd).mul_(_bcast(w, x))
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        x, w, rstd = ctx.saved_tensors
        k, n = x.size(0), x.size(-1)
        want_dw = ctx.needs_input_grad[1]
        if cpu_kernels.serves(x, n, cpu_kernels.MAX_NORM_WIDTH):
            g = g.contiguous()
            gx = torch.empty_like(x)
            dws = [cpu_kernels.rms_norm_bwd(g[m], x[m], w[m], rstd[m], want_dw, out=gx[m])[1] for m in range(k)]
            return gx, (torch.stack(cast(list[torch.Tensor], dws)) if want_dw else None), None
        x_hat = x * rstd
        gx_hat = g * x_hat
        dw = gx_hat.reshape(k, -1, n).sum(1) if want_dw else None
        c = torch.stack([gx_hat[m] @ w[m] for m in range(k)]).unsqueeze(-1).div_(n)  # the solo run's matmul
        gx = torch.mul(g, _bcast(w, g)).mul_(rstd).addcmul_(x_hat, c.mul_(rstd), value=-1.0)
        return gx, dw, None


class _PackedSquaredReLUMLP(torch.autograd.Function):
    """``fused._SquaredReLUMLP`` with a member dimension: the same row chunks per member, each chunk's products
    batched over the members, the weight gradients summed over the chunks in the same order."""

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        w_fc: torch.Tensor,
        w_proj: torch.Tensor,  # type: ignore[override]
        chunk: int,
    ) -> torch.Tensor:
        k = x.size(0)
        rows = x.reshape(k, -1, x.size(-1))
        n = rows.size(1)
        out = rows.new_empty(k, n, w_proj.size(1))
        kernels = cpu_kernels.serves(rows)
        hs = []
        for lo in range(0, n, chunk):
            hc = torch.bmm(rows[:, lo : lo + chunk], w_fc.transpose(1, 2))
            if kernels:
                sq = torch.empty_like(hc)
                cpu_kernels.relu_square_fwd(hc, sq)
            else:
                sq = hc.clamp_(min=0) * hc
            out[:, lo : lo + chunk] = torch.bmm(sq, w_proj.transpose(1, 2))
            hs.append(hc)
        ctx.save_for_backward(rows, w_fc, w_proj, *hs)
        ctx.chunk = chunk
        return out.view(*x.shape[:-1], w_proj.size(1))

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        rows, w_fc, w_proj, *hs = ctx.saved_tensors
        want_x, want_fc, want_proj, _ = ctx.needs_input_grad
        k = rows.size(0)
        grads = g.reshape(k, -1, g.size(-1))
        gx = torch.empty_like(rows) if want_x else None
        g_fc: torch.Tensor | None = None
        g_proj: torch.Tensor | None = None
        for c, hc in enumerate(hs):
            lo = c * ctx.chunk
            gc = grads[:, lo : lo + hc.size(1)]
            if cpu_kernels.serves(hc):
                sq = torch.empty_like(hc)
                gz = torch.bmm(gc, w_proj)
                cpu_kernels.relu_square_bwd(hc, gz, sq)
            else:
                sq = hc * hc
                gz = fused.squared_relu_grad(torch.bmm(gc, w_proj), hc)
            if want_proj:
                part = torch.bmm(gc.transpose(1, 2), sq)
                g_proj = part if g_proj is None else g_proj.add_(part)
            if want_fc:
                part = torch.bmm(gz.transpose(1, 2), rows[:, lo : lo + hc.size(1)])
                g_fc = part if g_fc is None else g_fc.add_(part)
            if gx is not None:
                gx[:, lo : lo + hc.size(1)] = torch.bmm(gz, w_fc)
        return (gx.view(*g.shape[:-1], rows.size(2)) if gx is not None else None), g_fc, g_proj, None


class _PackedSoftcapCE(torch.autograd.Function):
    """``loss._FusedSoftcapCE`` per member: the head's product batched over the members, the softcap, the
    log-sum-exp and the gradients over ``[k, rows, V]``; each member's mean loss and its own gradients."""

    @staticmethod
    def forward(
        ctx,
        h: torch.Tensor,
        w: torch.Tensor,
        targets: torch.Tensor,
        softcap: float | None,
        chunk: int,
        dtype: torch.dtype,
        graph: bool,
    ) -> torch.Tensor:  # type: ignore[override]
        want_h, want_w = graph and ctx.needs_input_grad[0], graph and ctx.needs_input_grad[1]
        k = h.size(0)
        wc = w.to(dtype)
        total = torch.zeros(k, dtype=torch.float32, device=h.device)
        grad_h = torch.empty_like(h) if want_h else None
        grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if want_w else None
        n_valid = (targets != -1).sum(1)
        scale = 1.0 / n_valid.clamp(min=1).float()
        for lo in range(0, h.size(1), chunk):
            hc = h[:, lo : lo + chunk].to(dtype)
            t = targets[:, lo : lo + chunk]
            keep = t != -1
            z = torch.bmm(hc, wc.transpose(1, 2)).float()
            if softcap is not None:
                th = z.div_(softcap).tanh_()
                z = th * softcap
            tgt = t.clamp(min=0).unsqueeze(-1)
            z_t = z.gather(-1, tgt).squeeze(-1)
            top = z.amax(dim=-1, keepdim=True)
            g = z.sub_(top).exp_()
            norm = g.sum(dim=-1, keepdim=True)
            total += ((top + norm.log()).squeeze(-1) - z_t).mul_(keep).sum(-1)
            if not (want_h or want_w):
                continue
            g.div_(norm)
            g.scatter_add_(-1, tgt, torch.full_like(tgt, -1, dtype=g.dtype))
            g.mul_((keep.float() * scale.unsqueeze(-1)).unsqueeze(-1))
            if softcap is not None:
                g.mul_(th.mul_(th).neg_().add_(1.0))
            gc = g.to(dtype)
            if grad_h is not None:
                grad_h[:, lo : lo + chunk] = torch.bmm(gc, wc)
            if grad_w is not None:
                grad_w += torch.bmm(gc.transpose(1, 2), hc).float()
        ctx.save_for_backward(
            grad_h if grad_h is not None else torch.empty(0),
            grad_w.to(w.dtype) if grad_w is not None else torch.empty(0),
        )
        return total * scale

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        grad_h, grad_w = ctx.saved_tensors
        k = grad_out.size(0)
        gh = grad_h * grad_out.to(grad_h.dtype).view(k, 1, 1) if ctx.needs_input_grad[0] else None
        gw = grad_w * grad_out.to(grad_w.dtype).view(k, 1, 1) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None, None, None


def interleaved_qkv(w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``fused.interleaved_qkv`` of every member: ``[k, d, d]`` x 3 -> ``[k, 3d, d]``."""
    k, d_out, d_in = w_q.shape
    heads, half = d_out // head_dim, head_dim // 2

    def paired(w: torch.Tensor) -> torch.Tensor:
        return w.view(k, heads, 2, half, d_in).transpose(2, 3)

    v = w_v.view(k, heads, half, 2, d_in)
    return torch.cat((paired(w_q), paired(w_k), v), dim=1).view(k, 3 * d_out, d_in)


# ---- the loop's technique over the members ------------------------------------------------------------------------


class PackedTechnique:
    """The members' technique on member-stacked tensors (``[k, *solo shape]``): the built-in injections in batched
    form, any other technique through ``torch.vmap`` over its members' parameters."""

    def __init__(self, pack: PackedLM, tech: Technique) -> None:
        self.pack, self.tech = pack, tech
        self.kind = type(tech)
        self.names = [n for n, _ in tech.named_parameters()]

    def grad(self, i: int, r: int) -> bool:
        return bool(self.tech.grad(i, r))

    def _p(self, name: str) -> torch.Tensor:
        return self.pack.p("inject." + name)

    def _vmapped(self, method: str, *args: Any) -> torch.Tensor:
        params = {"tech." + n: self._p(n) for n in self.names}
        dims = tuple(0 if isinstance(a, torch.Tensor) else None for a in args)
        return cast(torch.Tensor, torch.vmap(_method_call(self.tech, method), in_dims=(0, *dims))(params, *args))

    def init(self, e: torch.Tensor) -> torch.Tensor:
        if self.kind is AdditiveInjection:
            return torch.zeros_like(e)
        if self.kind is HyperConnect:
            lanes = cast(HyperConnect, self.tech).lanes
            return e.unsqueeze(1).expand(e.size(0), lanes, *e.shape[1:]).clone()
        if self.kind in (LinearInjection, Passthrough):
            return e
        return self._vmapped("init", e)

    def input(self, i: int, e: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        if self.kind is LinearInjection:
            return _mm(torch.cat((e, state), dim=-1), self._p("weight"))
        if self.kind is AdditiveInjection:
            return state + e
        if self.kind is Passthrough:
            return state
        if self.kind is HyperConnect:
            a = self._p("alpha")[:, i].to(state.dtype)
            return torch.einsum("mk,mk...->m...", a, state)
        return self._vmapped("input", i, e, state)

    def update(self, i: int, state: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        if self.kind in (LinearInjection, AdditiveInjection, Passthrough):
            return s
        if self.kind is HyperConnect:
            mix = self._p("mix")[:, i].to(state.dtype)
            b = self._p("beta")[:, i].to(state.dtype)
            lanes = torch.einsum("mkj,mj...->mk...", mix, state)
            return lanes + b.view(*b.shape, *([1] * (s.dim() - 1))) * s.unsqueeze(1)
        return self._vmapped("update", i, state, s)

    def readout(self, state: torch.Tensor) -> torch.Tensor:
        if self.kind is HyperConnect:
            return state.sum(dim=1)
        if self.kind in (LinearInjection, AdditiveInjection, Passthrough):
            return state
        return self._vmapped("readout", state)


def _method_call(tech: Technique, method: str) -> Callable[..., torch.Tensor]:
    """``tech.<method>(*args)`` with ``tech``'s parameters replaced by ``params`` (one member's, under vmap)."""

    def call(params: dict[str, torch.Tensor], *args: Any) -> torch.Tensor:
        return cast(torch.Tensor, torch.func.functional_call(_Method(tech, method), params, args))

    return call


class _Method(nn.Module):
    """A module whose forward is one method of a technique (``functional_call`` replaces its parameters)."""

    def __init__(self, tech: Technique, method: str) -> None:
        super().__init__()
        self.tech, self.method = tech, method

    def forward(self, *args: Any) -> torch.Tensor:
        return cast(torch.Tensor, getattr(self.tech, self.method)(*args))


BUILTIN = (LinearInjection, AdditiveInjection, Passthrough, HyperConnect)


def technique_packable(tech: Technique, d_model: int) -> str | None:
    """None if a pack can run ``tech`` (built in, or checked here under ``torch.vmap`` against its own calls on a
    probe batch), else why not. A technique that wraps the recurrent block (``block``) is never packed."""
    if type(tech) in BUILTIN:
        return None
    if type(tech).block is not Technique.block:
        return f"{type(tech).__name__} overrides block(): its recurrent blocks cannot run batched"
    try:
        with torch.no_grad():
            gen = torch.Generator().manual_seed(0)
            members = 2
            params = {"tech." + n: torch.stack([p.detach()] * members) for n, p in tech.named_parameters()}
            e = torch.randn(members, 1, 3, d_model, generator=gen)
            state = torch.vmap(_method_call(tech, "init"), in_dims=(0, 0))(params, e)
            want = tech.init(e[0])
            for i in range(min(2, getattr(tech, "r", 2) or 2)):
                u = torch.vmap(_method_call(tech, "input"), in_dims=(0, None, 0, 0))(params, i, e, state)
                s = torch.vmap(_method_call(tech, "update"), in_dims=(0, None, 0, 0))(params, i, state, u)
                u1 = tech.input(i, e[0], want)
                want = tech.update(i, want, u1)
                state = s
            out = torch.vmap(_method_call(tech, "readout"), in_dims=(0, 0))(params, state)
            solo = tech.readout(want)
        if not torch.allclose(out[0], solo, rtol=1e-5, atol=1e-6):
            return f"{type(tech).__name__} gives other numbers under torch.vmap"
    except Exception as exc:  # the user's code under vmap: any failure means "train it alone"
        return f"{type(tech).__name__} does not run under torch.vmap ({type(exc).__name__}: {str(exc)[:120]})"
    return None


# ---- the pack ---------------------------------------------------------------------------------------------------


class PackedLM(nn.Module):
    """k same-shaped ``LoopedLM`` members as one model; ``forward(idx, targets)`` -> each member's mean loss ``[k]``.

    ``idx`` and ``targets`` are ``[k, B, T]``: each member its own rows (its own data stream). ``keep(indices)``
    drops members (finished, diverged, failed); the members left are re-attached to the new, smaller stacks.
    """

    def __init__(self, members: Sequence[LoopedLM]) -> None:
        super().__init__()
        if not members:
            raise ValueError("a pack needs at least one member")
        first = members[0]
        self.cfg = first.cfg
        layout = [(n, tuple(p.shape)) for n, p in first.named_parameters()]
        for m in members[1:]:
            if [(n, tuple(p.shape)) for n, p in m.named_parameters()] != layout or m.cfg.r != self.cfg.r:
                raise ValueError("a pack's members must have the same parameters and shapes")
        self.names = [n for n, _ in layout]
        self.params = nn.ParameterDict(
            {
                _key(n): nn.Parameter(torch.stack([dict(m.named_parameters())[n].detach() for m in members]))
                for n in self.names
            }
        )
        self.members: list[LoopedLM] = list(members)
        self._rotary = [first.rotary]  # shared, not a submodule (the members own it)
        self.fused_loss = first.fused_loss
        self.tech = PackedTechnique(self, first.inject) if self.cfg.is_looped else None
        self.attach()

    @property
    def k(self) -> int:
        return len(self.members)

    def p(self, name: str) -> nn.Parameter:
        return self.params[_key(name)]

    def stacked(self) -> dict[str, nn.Parameter]:
        """Each member parameter's name (as in ``LoopedLM.named_parameters``) -> its ``[k, ...]`` stack."""
        return {n: self.p(n) for n in self.names}

    @torch.no_grad()
    def attach(self) -> None:
        """Make every member's parameters views of its slice of the stacks."""
        for i, member in enumerate(self.members):
            for n, q in member.named_parameters():
                q.data = self.p(n).data[i]

    @torch.no_grad()
    def keep(self, indices: Sequence[int]) -> None:
        """Keep only the members at ``indices`` (in that order). A dropped member keeps its last weights (its
        parameters still view the old stacks, which nothing updates any more)."""
        idx = list(indices)
        sel = torch.tensor(idx, dtype=torch.long, device=next(iter(self.params.values())).device)
        for n in self.names:
            self.params[_key(n)] = nn.Parameter(self.p(n).data.index_select(0, sel))
        self.members = [self.members[i] for i in idx]
        self.attach()

    # ---- forward ---------------------------------------------------------------------------------------------
    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        k = idx.size(0)
        emb = self.p("embed.weight")
        offsets = (torch.arange(k, device=idx.device) * emb.size(1)).view(k, 1, 1)
        x = F.embedding(idx + offsets, emb.reshape(-1, emb.size(-1)))
        x = self._norm("norm_emb.weight", x)
        x = self._stack("prelude", cfg.n_prelude, x)
        x = self._stack("recur", cfg.n_recur, x) if not cfg.is_looped else self._loop(x)
        x = self._norm("norm_final.weight", self._stack("coda", cfg.n_coda, x))
        return self._loss(x, targets)

    def _norm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        w = self.p(name)
        if fused.use_fused(x):
            return cast(torch.Tensor, _PackedRMSNorm.apply(x, w, self.cfg.norm_eps))
        return F.rms_norm(x, (x.size(-1),), eps=self.cfg.norm_eps) * _bcast(w, x)

    def _stack(self, part: str, n: int, x: torch.Tensor) -> torch.Tensor:
        for i in range(n):
            x = self._block(f"{part}.{i}.", x)
        return x

    def _block(self, pre: str, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(pre + "attn.", self._norm(pre + "norm1.weight", x))
        return x + self._mlp(pre + "mlp.", self._norm(pre + "norm2.weight", x))

    def _attention(self, pre: str, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        k, B, T, d = x.shape
        hd = cfg.head_dim
        w_q, w_k, w_v, w_o = (self.p(f"{pre}{n}.weight") for n in ("q", "k", "v", "out"))
        rotary = self._rotary[0]
        y: torch.Tensor
        if fused.use_fused(x):
            w = interleaved_qkv(w_q, w_k, w_v, hd)
            qkv = _mm(x, w).view(k * B, T, 3, d // hd, hd)
            turn = rotary.turn(0, T, qkv)
            if fused.attention_kernel_serves(qkv):
                y = fused.rope_qk_norm_attention(qkv, turn, cfg.norm_eps)
            else:
                q, kk, v = (t.transpose(1, 2) for t in fused.rope_qk_norm(qkv, turn, cfg.norm_eps))
                y = F.scaled_dot_product_attention(q, kk, v, is_causal=True).transpose(1, 2).reshape(k * B, T, d)
        else:
            qkv = _mm(x, torch.cat((w_q, w_k, w_v), dim=1)).view(k * B, T, 3, d // hd, hd)
            qk = qkv[:, :, :2].permute(2, 0, 3, 1, 4)
            v = qkv[:, :, 2].transpose(1, 2)
            qk = qk_norm(rotary(qk, 0), cfg.norm_eps)
            y = F.scaled_dot_product_attention(qk[0], qk[1], v, is_causal=True).transpose(1, 2).reshape(k * B, T, d)
        return _mm(y.view(k, B, T, d), w_o)

    def _mlp(self, pre: str, x: torch.Tensor) -> torch.Tensor:
        w_fc, w_proj = self.p(pre + "fc.weight"), self.p(pre + "proj.weight")
        if fused.use_fused(x):
            chunk = mlp_chunk_rows(w_fc.size(1))
            return cast(torch.Tensor, _PackedSquaredReLUMLP.apply(x, w_fc, w_proj, chunk))
        if torch.is_grad_enabled():
            return _mm(squared_relu(_mm(x, w_fc)), w_proj)
        h = F.relu(_mm(x, w_fc))
        return _mm(h * h, w_proj)

    def _loop(self, e: torch.Tensor) -> torch.Tensor:
        tech = self.tech
        assert tech is not None  # looped configs only
        r = self.cfg.r
        grad = torch.is_grad_enabled()
        state = tech.init(e)
        for i in range(r):
            with torch.no_grad() if grad and not tech.grad(i, r) else contextlib.nullcontext():
                u = tech.input(i, e, state)
                s = self._norm("norm_recur.weight", self._stack("recur", self.cfg.n_recur, u))
                state = tech.update(i, state, s)
        return tech.readout(state)

    def _loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        k = x.size(0)
        h = x.reshape(k, -1, x.size(-1))
        t = targets.reshape(k, -1)
        if self.fused_loss:
            head = self.p("head.weight")[:, : cfg.vocab_size]
            dtype = compute_dtype(h.device, h.dtype)
            # no more rows per member than a solo run's chunk, and no more logits in all (loopscale.memory)
            rows = max(1, min(chunk_rows(head.size(1), h.size(1)), chunk_rows(head.size(1), k * h.size(1)) // k))
            with torch.autocast(h.device.type, enabled=False):
                out = _PackedSoftcapCE.apply(h, head, t, cfg.softcap, rows, dtype, torch.is_grad_enabled())
            return cast(torch.Tensor, out)
        full = self.p("head.weight")  # the solo run's product over the padded rows, then the real vocabulary
        logits = torch.matmul(h, full.transpose(1, 2))[..., : cfg.vocab_size].float()
        if cfg.softcap is not None:
            logits = cfg.softcap * torch.tanh(logits / cfg.softcap)
        return torch.stack([F.cross_entropy(logits[m], t[m], ignore_index=-1) for m in range(k)])
