"""The fused CPU functions (loopscale/model/fused.py) against the plain path and finite differences."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from loopscale.config import ModelConfig
from loopscale.errors import ConfigError
from loopscale.model import LoopedLM, fused
from loopscale.model.layers import Rotary, qk_norm
from loopscale.train.hardware import MALLOC_ENV, tune_cpu_malloc


@pytest.fixture
def plain_path():
    """Run a block of code with the fused functions off; always turned back on."""

    class Switch:
        def __enter__(self):
            fused.ENABLED = False

        def __exit__(self, *exc):
            fused.ENABLED = True

    yield Switch()
    fused.ENABLED = True


def f64(*shape, grad=True):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=grad)


def test_gradcheck_rms_norm():
    torch.manual_seed(0)
    x, w = f64(3, 4, 8), f64(8)
    assert torch.autograd.gradcheck(lambda a, b: fused.rms_norm(a, b, 1e-6), (x, w))


def test_gradcheck_rope_qk_norm():
    torch.manual_seed(1)
    qkv = f64(2, 5, 3, 2, 8)
    cos, sin = torch.rand(5, 4, dtype=torch.float64), torch.rand(5, 4, dtype=torch.float64)
    turn = torch.complex(cos, -sin)
    assert torch.autograd.gradcheck(lambda a: fused.rope_qk_norm(a, turn, 1e-6), (qkv,))


@pytest.mark.parametrize("chunk", [7, 64])  # several chunks with a ragged last one, and one chunk
def test_gradcheck_squared_relu_mlp(chunk):
    torch.manual_seed(2)
    x, w_fc, w_proj = f64(3, 10, 4), f64(12, 4), f64(4, 12)
    assert torch.autograd.gradcheck(lambda a, b, c: fused.squared_relu_mlp(a, b, c, chunk), (x, w_fc, w_proj))


def test_squared_relu_mlp_matches_plain_and_frozen_weights():
    torch.manual_seed(3)
    x, w_fc, w_proj = torch.randn(4, 50, 16), torch.randn(64, 16), torch.randn(16, 64)
    h = F.relu(F.linear(x, w_fc)) ** 2
    want = F.linear(h, w_proj)
    # chunks of 32 hidden units sum the 64-term projection in two parts: fp32 reassociation, whose size depends
    # on the CPU's GEMM kernels (AVX2 vs AVX-512); bound it by the terms' magnitudes, not a fixed rtol
    bound = 64 * 2.0**-24 * F.linear(h.abs(), w_proj.abs()) + 1e-6
    assert bool(((fused.squared_relu_mlp(x, w_fc, w_proj, 32) - want).abs() <= bound).all())
    x.requires_grad_(True)  # weights without gradients: only x's is computed
    fused.squared_relu_mlp(x, w_fc, w_proj, 32).sum().backward()
    assert x.grad is not None and w_fc.grad is None


def test_rms_norm_matches_the_plain_kernel():
    torch.manual_seed(4)
    x, w = torch.randn(6, 32, requires_grad=True), torch.randn(32, requires_grad=True)
    torch.testing.assert_close(fused.rms_norm(x, w, 1e-6), F.rms_norm(x.detach(), (32,), w.detach(), 1e-6))


def test_rope_qk_norm_is_the_paper_rotation_in_interleaved_rows():
    """q and k of the fused function, put back into half-split order, are the plain path's RoPE + QK-norm."""
    torch.manual_seed(5)
    B, T, H, hd = 2, 7, 3, 8
    rot = Rotary(hd)
    qkv_half = torch.randn(B, T, 3, H, hd)
    eye = torch.eye(H * hd)
    order = fused.interleaved_qkv(eye, eye, eye, hd)[: H * hd].argmax(1)[:hd]  # within a head: 0, hd/2, 1, ...
    assert order.tolist() == [i // 2 + (hd // 2) * (i % 2) for i in range(hd)]
    qkv_inter = qkv_half.clone()
    qkv_inter[:, :, :2] = qkv_half[:, :, :2, :, order]
    for past in (0, 5):
        q, k, v = fused.rope_qk_norm(qkv_inter, rot.turn(past, T, qkv_inter), 1e-6)
        want = qk_norm(rot(qkv_half[:, :, :2].permute(2, 0, 3, 1, 4), past), 1e-6)  # [2, B, H, T, hd]
        back = torch.empty_like(q)
        back[..., order] = q
        torch.testing.assert_close(back.transpose(1, 2), want[0], rtol=1e-5, atol=1e-6)
        back[..., order] = k
        torch.testing.assert_close(back.transpose(1, 2), want[1], rtol=1e-5, atol=1e-6)
        assert torch.equal(v, qkv_half[:, :, 2])


@pytest.mark.parametrize(
    "r,injection,math", [(1, "linear", False), (2, "linear", False), (2, "additive", False), (2, "linear", True)]
)
def test_model_fused_matches_plain(r, injection, math):
    """Loss, every gradient, eval logits and KV-cached decoding agree with the plain ops (also with SDPA's
    math backend, whose gradients come in another memory layout)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(6)
    cfg = ModelConfig(d_model=64, head_dim=16, L_eff=6, r=r, seq_len=32, vocab_size=320, injection=injection)
    model = LoopedLM(cfg)
    x = torch.randint(0, 320, (3, 33))

    def run(on: bool) -> tuple:
        fused.ENABLED = on
        try:
            assert fused.use_fused(x.float()) is on
            model.zero_grad()
            with sdpa_kernel(SDPBackend.MATH) if math else contextlib.nullcontext():
                loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
            with torch.no_grad():
                logits, tokens = model(x[:, :20]), model.generate(x[:, :6], 10)
            return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, logits, tokens
        finally:
            fused.ENABLED = True

    (l0, g0, z0, t0), (l1, g1, z1, t1) = run(False), run(True)
    torch.testing.assert_close(l1, l0, rtol=1e-6, atol=1e-6)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-4, atol=1e-7, msg=lambda m, n=n: f"{n}: {m}")
    torch.testing.assert_close(z1, z0, rtol=1e-5, atol=1e-5)
    assert torch.equal(t1, t0)


def test_use_fused_only_on_cpu_float_without_autocast(plain_path):
    assert fused.use_fused(torch.zeros(2))
    assert fused.use_fused(torch.zeros(2, dtype=torch.float64))
    assert not fused.use_fused(torch.zeros(2, dtype=torch.bfloat16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fused.use_fused(torch.zeros(2))
    with plain_path:
        assert not fused.use_fused(torch.zeros(2))


def test_bf16_autocast_on_cpu_takes_the_plain_path(monkeypatch):
    """Under CPU autocast no fused function is called (each would raise), and training still works;
    in fp32 the same model does call them."""
    calls = []

    def refuse(name):
        def f(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"fused.{name} called")

        return f

    for name in ("rms_norm", "rope_qk_norm", "squared_relu_mlp"):
        monkeypatch.setattr(fused, name, refuse(name))
    torch.manual_seed(7)
    cfg = ModelConfig(d_model=32, head_dim=16, L_eff=6, r=2, seq_len=16, vocab_size=64)
    model = LoopedLM(cfg)
    x = torch.randint(0, 64, (2, 17))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    assert torch.isfinite(loss) and calls == []
    with pytest.raises(AssertionError, match="fused"):
        model(x[:, :-1], x[:, 1:])


def test_tune_cpu_malloc(monkeypatch):
    import platform

    monkeypatch.setenv(MALLOC_ENV, "default")
    assert tune_cpu_malloc() is False
    monkeypatch.setenv(MALLOC_ENV, "tuned")
    assert tune_cpu_malloc() is (platform.libc_ver()[0] == "glibc")
    monkeypatch.delenv(MALLOC_ENV)
    assert tune_cpu_malloc() is (platform.libc_ver()[0] == "glibc")
    monkeypatch.setenv(MALLOC_ENV, "off")  # a typo is refused, not silently ignored
    with pytest.raises(ConfigError, match=r"LOOPSCALE_MALLOC.*'default'"):
        tune_cpu_malloc()
