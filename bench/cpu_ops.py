"""One op at a time: the compiled CPU kernels (loopscale/model/cpu_kernels.c) against torch's ops, fp32.

    python bench/cpu_ops.py [--batch 16 --seq-len 256 --heads 4 --head-dim 32] [--repeats 15]

Forward + backward of each op on issue 20's shape ([16, 256, 128] activations, 4 heads of 32), all variants
interleaved in one process, median ms of ``--repeats``: RMSNorm (C, fused.py's torch ops, ``F.rms_norm``
with autograd, and LayerNorm as nanoGPT's norm), RoPE + QK-norm (C, torch ops), and causal attention on
RoPE's output (C, torch's SDPA with its CPU flash kernel, SDPA's math backend). The trainer's allocator
settings apply. bench/step_profile.py shows where the time goes in a whole step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from loopscale.model import cpu_kernels, fused
from loopscale.model.layers import Rotary
from loopscale.train.hardware import tune_cpu_malloc
from model_step import hardware


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    tuned = tune_cpu_malloc()
    print(
        f"hardware: {hardware()}  malloc: {'tuned (as the trainer)' if tuned else 'default'}  "
        f"cpu kernels: {cpu_kernels.status()}"
    )
    B, T, H, hd = args.batch, args.seq_len, args.heads, args.head_dim
    d = H * hd
    torch.manual_seed(0)
    x, w, g = torch.randn(B, T, d), torch.ones(d), torch.randn(B, T, d)
    qkv, g3 = torch.randn(B, T, 3, H, hd), [torch.randn(B, T, H, hd) for _ in range(3)]
    turn = Rotary(hd).turn(0, T, qkv)
    normed = fused.rope_qk_norm(qkv, turn, 1e-6)  # attention's inputs: RoPE'd, normed q and k
    packed = torch.stack(normed, dim=2).contiguous()

    def grad_of(fn, *leaves, grads):
        def run() -> None:
            ins = [t.detach().requires_grad_() for t in leaves]
            out = fn(*ins)
            torch.autograd.backward(out, grads)

        return run

    def with_kernels(on: bool, run):
        def wrapped() -> None:
            cpu_kernels.ENABLED = on
            try:
                run()
            finally:
                cpu_kernels.ENABLED = True

        return wrapped

    def sdpa(backend):
        def fn(p):
            q, k, v = (p[:, :, i].transpose(1, 2) for i in range(3))
            with sdpa_kernel(backend):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return y.transpose(1, 2).reshape(B, T, d)

        return fn

    def c_attention(p):
        return fused._CausalAttention.apply(p)

    ln = torch.nn.LayerNorm(d, bias=False)
    variants = {
        "RMSNorm, C": with_kernels(True, grad_of(lambda a: fused.rms_norm(a, w, 1e-6), x, grads=g)),
        "RMSNorm, fused.py torch ops": with_kernels(False, grad_of(lambda a: fused.rms_norm(a, w, 1e-6), x, grads=g)),
        "RMSNorm, F.rms_norm + autograd": grad_of(lambda a: F.rms_norm(a, (d,), w, 1e-6), x, grads=g),
        "LayerNorm (nanoGPT's norm)": grad_of(ln, x, grads=g),
        "RoPE + QK-norm, C": with_kernels(True, grad_of(lambda a: fused.rope_qk_norm(a, turn, 1e-6), qkv, grads=g3)),
        "RoPE + QK-norm, torch ops": with_kernels(
            False, grad_of(lambda a: fused.rope_qk_norm(a, turn, 1e-6), qkv, grads=g3)
        ),
        "attention, C": grad_of(c_attention, packed, grads=g),
        "attention, SDPA (CPU flash)": grad_of(sdpa(SDPBackend.FLASH_ATTENTION), packed, grads=g),
        "attention, SDPA math": grad_of(sdpa(SDPBackend.MATH), packed, grads=g),
    }
    if cpu_kernels.library() is None:
        variants = {k: v for k, v in variants.items() if ", C" not in k}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for run in variants.values():
        run()
    for _ in range(args.repeats):
        for name, run in variants.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    print(
        f"\nforward + backward, median ms of {args.repeats}; [B, T, d] = [{B}, {T}, {d}], {H} heads of {hd}, "
        f"{torch.get_num_threads()} threads"
    )
    for name, ts in times.items():
        print(f"{name:>34} {1e3 * statistics.median(ts):8.2f}")


if __name__ == "__main__":
    main()
