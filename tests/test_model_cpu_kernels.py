"""The compiled CPU kernels (loopscale/model/cpu_kernels.c) against fused.py's torch ops, and their loader."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from loopscale.config import ModelConfig
from loopscale.errors import ConfigError
from loopscale.model import LoopedLM, cpu_kernels, fused
from loopscale.model.layers import Rotary


@pytest.fixture
def kernels(monkeypatch):
    """``kernels(False)`` runs fused.py's torch ops, ``kernels(True)`` the compiled kernels (built in the
    session's cache, not the user's: the skip is decided here, not at collection; skipped without a C
    compiler)."""

    def switch(on: bool) -> None:
        monkeypatch.setenv(cpu_kernels.ENV, "on" if on else "off")
        cpu_kernels.reset()
        if on and cpu_kernels.library() is None:
            pytest.skip(f"no compiled CPU kernels: {cpu_kernels.status()}")
        assert (cpu_kernels.library() is not None) is on

    yield switch
    monkeypatch.delenv(cpu_kernels.ENV, raising=False)
    cpu_kernels.reset()


def _against_torch_ops(kernels, run, **tol) -> None:
    """``run()`` with fused.py's torch ops, then with the kernels: every output agrees (``tol``: assert_close's)."""
    kernels(False)
    want = run()
    kernels(True)
    got = run()
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **({"rtol": 1e-5, "atol": 1e-5} | tol))


def _rms(x, w, g):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fused.rms_norm(x, w, 1e-6)
    y.backward(g)
    return y.detach(), x.grad, w.grad


@pytest.mark.parametrize("shape", [(2, 5, 20), (3, 64, 128), (1, 300, 48)])  # widths off the 8-lane grid too
def test_rms_norm_kernel_matches_the_torch_ops(kernels, shape):
    torch.manual_seed(0)
    x, w, g = torch.randn(shape), torch.randn(shape[-1]), torch.randn(shape)
    _against_torch_ops(kernels, lambda: _rms(x, w, g))


def test_rms_norm_kernel_without_weight_gradient_and_with_strided_input(kernels):
    kernels(True)
    torch.manual_seed(1)
    base = torch.randn(64, 2, 32)
    x = base[:, 0]  # not contiguous: the function makes it so
    w = torch.randn(32, 3)[:, 1]  # strided too (copied for the call); no gradient wanted
    x.requires_grad_()
    fused.rms_norm(x, w, 1e-6).sum().backward()
    kernels(False)
    x2 = base[:, 0].clone().requires_grad_()
    fused.rms_norm(x2, w, 1e-6).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-5, atol=1e-6)


def _rope(qkv, turn, grads):
    x = qkv.clone().requires_grad_()
    q, k, v = fused.rope_qk_norm(x, turn, 1e-6)
    torch.autograd.backward((q, k, v), grads)
    return q.detach(), k.detach(), v.detach(), x.grad


@pytest.mark.parametrize("hd,H", [(16, 2), (32, 4), (64, 1), (128, 2), (8, 3), (24, 5)])  # inlined sizes + others
@pytest.mark.parametrize("layout", ["contiguous", "heads-first", "strided-last"])
def test_rope_qk_norm_kernel_matches_the_torch_ops(kernels, hd, H, layout):
    """Values and gradients for every head size, with the gradients of q, k, v in the layouts SDPA's
    backends hand over ([B, H, T, hd] transposed; math's non-unit last stride) and a table offset."""
    torch.manual_seed(2)
    B, T = 2, 9
    qkv = torch.randn(B, T, 3, H, hd)
    turn = Rotary(hd).turn(3, T, qkv)

    def grad() -> torch.Tensor:
        if layout == "heads-first":
            return torch.randn(B, H, T, hd).transpose(1, 2)
        if layout == "strided-last":
            return torch.randn(B, T, H, hd, 2)[..., 0]
        return torch.randn(B, T, H, hd)

    grads = [grad() for _ in range(3)]
    _against_torch_ops(kernels, lambda: _rope(qkv, turn, grads))


@pytest.mark.parametrize("shape", [(1, 2, 3, cpu_kernels.MAX_HEADS + 1, 2), (1, 2, 3, 1, cpu_kernels.MAX_HEAD_DIM + 2)])
def test_shapes_beyond_the_kernels_buffers_take_the_torch_ops(kernels, shape):
    torch.manual_seed(6)
    qkv = torch.randn(shape)
    turn = Rotary(shape[-1]).turn(0, shape[1], qkv)
    grads = [torch.randn(*shape[:2], *shape[3:]) for _ in range(3)]
    _against_torch_ops(kernels, lambda: _rope(qkv, turn, grads), rtol=0, atol=0)  # the same torch ops, bit for bit


def _attention(qkv, turn, g, *, kernel: bool):
    """rope_qk_norm then causal attention, [B, T, H * hd]: all in C, or rope_qk_norm + torch's SDPA."""
    x = qkv.clone().requires_grad_()
    if kernel:
        y = fused.rope_qk_norm_attention(x, turn, 1e-6)
    else:
        q, k, v = (t.transpose(1, 2) for t in fused.rope_qk_norm(x, turn, 1e-6))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(*qkv.shape[:2], -1)
    y.backward(g)
    return y.detach(), x.grad


@pytest.mark.parametrize(
    "B,T,H,hd",
    [(2, 64, 3, 16), (1, 100, 4, 32), (3, 37, 1, 64), (1, 50, 2, 128), (2, 7, 2, 48), (1, 1, 2, 16), (1, 300, 1, 32)],
)  # inlined + other sizes
@pytest.mark.parametrize("grad_layout", ["contiguous", "strided"])
def test_attention_kernel_matches_sdpa(kernels, B, T, H, hd, grad_layout):
    """The C attention (register tiles, causal blocks, T off the tiles' grid) against SDPA on the same q, k, v:
    outputs and the gradient of q, k and v, also for an incoming gradient that is not contiguous."""
    kernels(True)
    torch.manual_seed(8)
    qkv = torch.randn(B, T, 3, H, hd)
    turn = Rotary(hd).turn(0, T, qkv)
    g = torch.randn(B, H * hd, T).transpose(1, 2) if grad_layout == "strided" else torch.randn(B, T, H * hd)
    assert fused.attention_kernel_serves(qkv)
    got, want = _attention(qkv, turn, g, kernel=True), _attention(qkv, turn, g, kernel=False)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_attention_kernel_is_bitwise_the_same_for_any_thread_count(kernels):
    kernels(True)
    torch.manual_seed(9)
    qkv, g = torch.randn(2, 70, 3, 3, 32), torch.randn(2, 70, 96)
    turn = Rotary(32).turn(0, 70, qkv)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _attention(qkv, turn, g, kernel=True)
        torch.set_num_threads(2)
        two = _attention(qkv, turn, g, kernel=True)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


def test_attention_kernel_propagates_nan(kernels):
    """A NaN in one sequence's keys makes that sequence's later outputs NaN (a diverged run is seen as one);
    the other sequence is untouched."""
    kernels(True)
    torch.manual_seed(10)
    qkv = torch.randn(2, 20, 3, 1, 16)
    qkv[0, 5, 1, 0, 3] = float("nan")
    y = fused.rope_qk_norm_attention(qkv, Rotary(16).turn(0, 20, qkv), 1e-6)
    assert y[0, 5:].isnan().all() and not y[0, :5].isnan().any() and not y[1].isnan().any()


def test_attention_kernel_steps_aside_for_other_sizes_backends_and_modes(kernels):
    """hd off the 16-wide tiles, SDPA restricted to another backend (as the FLOP counter test does), and
    dispatch modes (a FlopCounterMode must see the attention products) all run SDPA."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    kernels(True)
    assert fused.attention_kernel_serves(torch.zeros(1, 4, 3, 2, 32))
    assert not fused.attention_kernel_serves(torch.zeros(1, 4, 3, 2, 24))
    with sdpa_kernel(SDPBackend.MATH):
        assert not fused.attention_kernel_serves(torch.zeros(1, 4, 3, 2, 32))
    with FlopCounterMode(display=False):
        assert not fused.attention_kernel_serves(torch.zeros(1, 4, 3, 2, 32))
    kernels(False)
    assert not fused.attention_kernel_serves(torch.zeros(1, 4, 3, 2, 32))


@pytest.mark.parametrize("chunk", [7, 64])  # ragged chunks and one chunk
def test_squared_relu_mlp_kernels_are_the_torch_ops_bit_for_bit(kernels, chunk):
    """relu and square, 2 g h and h^2 in one pass each: the same arithmetic, so every value is identical;
    a NaN pre-activation stays NaN (a diverged run must still be seen as one)."""
    torch.manual_seed(7)
    x, w_fc, w_proj, g = torch.randn(3, 10, 16), torch.randn(48, 16), torch.randn(16, 48), torch.randn(3, 10, 16)
    x[1, 2, 3] = float("nan")

    def run():
        ins = [t.clone().requires_grad_() for t in (x, w_fc, w_proj)]
        y = fused.squared_relu_mlp(*ins, chunk)
        y.backward(g)
        return [y.detach()] + [t.grad for t in ins]

    _against_torch_ops(kernels, run, rtol=0, atol=0, equal_nan=True)
    y = run()[0]
    assert y[1, 2].isnan().all() and not y[0].isnan().any()


def test_kernels_are_bitwise_reproducible_across_calls(kernels):
    kernels(True)
    torch.manual_seed(3)
    x, w, g = torch.randn(8, 256, 64), torch.randn(64), torch.randn(8, 256, 64)
    first, second = _rms(x, w, g), _rms(x, w, g)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("r", [1, 2])
def test_model_with_kernels_matches_the_torch_ops(kernels, r):
    """Loss, every gradient and greedy decoding with a KV cache: the kernels agree with fused.py's torch ops."""
    torch.manual_seed(4)
    cfg = ModelConfig(d_model=64, head_dim=16, L_eff=6, r=r, seq_len=32, vocab_size=320)
    model = LoopedLM(cfg)
    x = torch.randint(0, 320, (3, 33))

    def run(on: bool):
        kernels(on)
        model.zero_grad()
        loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        with torch.no_grad():
            tokens = model.generate(x[:, :6], 10)
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, tokens

    (l0, g0, t0), (l1, g1, t1) = run(False), run(True)
    torch.testing.assert_close(l1, l0, rtol=1e-6, atol=1e-6)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-4, atol=1e-7, msg=lambda m, n=n: f"{n}: {m}")
    assert torch.equal(t1, t0)


def test_kernels_serve_fp32_only(kernels):
    kernels(True)
    x = torch.zeros(2, 8)
    assert cpu_kernels.serves(x, 8, cpu_kernels.MAX_NORM_WIDTH)
    assert not cpu_kernels.serves(x.double(), 8, cpu_kernels.MAX_NORM_WIDTH)  # fp64: torch ops (gradcheck)
    assert not cpu_kernels.serves(x, cpu_kernels.MAX_NORM_WIDTH + 1, cpu_kernels.MAX_NORM_WIDTH)


def test_off_and_bad_values(kernels, monkeypatch):
    kernels(False)
    assert cpu_kernels.status().startswith("off")
    monkeypatch.setenv(cpu_kernels.ENV, "no")  # a typo is refused, not silently ignored
    cpu_kernels.reset()
    with pytest.raises(ConfigError, match=r"LOOPSCALE_CPU_KERNELS.*'off'"):
        cpu_kernels.library()


def test_without_a_compiler_the_torch_ops_run(kernels, monkeypatch, tmp_path):
    """No compiler (or one that fails): the status says so, the model still trains on fused.py's ops."""
    monkeypatch.setenv("LOOPSCALE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    cpu_kernels.reset()
    assert cpu_kernels.library() is None
    assert "unavailable" in cpu_kernels.status()
    bad = tmp_path / "bad-cc"
    bad.write_text("#!/bin/sh\necho 'cc: error: out of licences' >&2\nexit 1\n")
    bad.chmod(0o755)
    monkeypatch.setenv("CC", str(bad))
    cpu_kernels.reset()
    assert cpu_kernels.library() is None
    assert "out of licences" in cpu_kernels.status()
    torch.manual_seed(5)
    model = LoopedLM(ModelConfig(d_model=32, head_dim=16, L_eff=6, r=1, seq_len=16, vocab_size=64))
    x = torch.randint(0, 64, (2, 17))
    loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    assert torch.isfinite(loss)


def test_the_build_is_cached_and_reused(kernels, monkeypatch):
    """The session's build is loaded again without compiling (a fresh cache's first build, and what it leaves
    on disk, are checked by the damaged-build test below)."""
    kernels(True)  # skips without a compiler

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    cpu_kernels.reset()
    assert cpu_kernels.library() is not None and cpu_kernels.status().startswith("compiled")


def test_fake_tensors_take_the_torch_ops(kernels):
    """FakeTensorMode (the memory model's shape checks) has no buffers to hand to C: the torch ops serve
    it (a raw pointer from a fake tensor would crash the process)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    kernels(True)
    cfg = ModelConfig(d_model=32, head_dim=16, L_eff=6, r=2, seq_len=16, vocab_size=64)
    with FakeTensorMode():
        model = LoopedLM(cfg)
        x = torch.randint(0, 64, (2, 17))
        loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        assert not cpu_kernels.serves(x.float(), 8, cpu_kernels.MAX_NORM_WIDTH)
    assert loss.shape == ()


@pytest.mark.long
def test_a_damaged_cached_build_is_removed_and_rebuilt(kernels, tmp_path):
    """A build damaged on disk (a crash mid-write) is dropped and the next process rebuilds it. In separate
    processes: a process that has loaded a library must never see its file change (builds are renamed
    into place, a new inode, for that reason)."""
    import os
    import shutil
    import sys

    kernels(True)  # skips without a compiler
    env = {**os.environ, "LOOPSCALE_CACHE": str(tmp_path)}
    env.pop(cpu_kernels.ENV, None)
    session_build = Path(cpu_kernels.library()._name)  # the session's build, under its cache key (no recompile)
    (tmp_path / "kernels").mkdir()
    shutil.copy(session_build, tmp_path / "kernels" / session_build.name)

    def status() -> str:
        code = "from loopscale.model import cpu_kernels as c; print(c.status())"
        return subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()

    assert status().startswith("compiled")
    (built,) = (tmp_path / "kernels").glob("cpu_kernels-*.so")
    built.write_bytes(b"not a shared library")
    assert "cached build was removed" in status() and not built.exists()
    assert status().startswith("compiled") and built.is_file()  # rebuilt, under the same key
    assert list((tmp_path / "kernels").glob("cpu_kernels-*.so")) == [built]
    assert not list((tmp_path / "kernels").glob(".cpu_kernels.*"))  # no temporary left


def test_an_instruction_set_is_chosen_with_loopscale_cpu_march_and_refused_when_this_cpu_lacks_it(kernels, monkeypatch):
    kernels(False)
    monkeypatch.setenv(cpu_kernels.ENV, "on")
    monkeypatch.setenv(cpu_kernels.MARCH_ENV, "x86-64-v3; rm -rf /")  # a flag string, never a shell word
    cpu_kernels.reset()
    with pytest.raises(ConfigError, match=r"LOOPSCALE_CPU_MARCH.*x86-64-v3"):
        cpu_kernels.library()
    if cpu_kernels._compiler() is None or cpu_kernels._cpu_flags() is None:
        pytest.skip("needs a C compiler and an x86 CPU's flags")
    # a build for AVX-512 on a CPU without it would die of SIGILL on its first call: refused beforehand
    monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: ["sse4_2", "avx", "avx2", "fma", "f16c"])
    monkeypatch.setenv(cpu_kernels.MARCH_ENV, "x86-64-v4")
    cpu_kernels.reset()
    assert cpu_kernels.library() is None
    assert "LOOPSCALE_CPU_MARCH=x86-64-v4 needs avx512f" in cpu_kernels.status()


def test_avx2_and_native_builds_give_the_same_bits(kernels, monkeypatch):
    """The kernels' vectors are 8 lanes whatever the instruction set, and both builds contract a*b+c into FMAs:
    an AVX2 (x86-64-v3) build gives the bits of this CPU's native one (AVX-512 on the EPYCs CI runs on)."""
    kernels(True)
    if "avx2" not in (cpu_kernels._cpu_flags() or []):
        pytest.skip("needs an x86 CPU with AVX2")
    torch.manual_seed(6)
    cfg = ModelConfig(d_model=64, head_dim=32, L_eff=6, r=2, seq_len=48, vocab_size=320)
    model = LoopedLM(cfg)
    x = torch.randint(0, 320, (3, 49))

    def run(march: str | None):
        if march is None:
            monkeypatch.delenv(cpu_kernels.MARCH_ENV, raising=False)
        else:
            monkeypatch.setenv(cpu_kernels.MARCH_ENV, march)
        cpu_kernels.reset()
        assert march is None or f"-march={march}" in cpu_kernels.status()
        model.zero_grad()
        loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    (l0, g0), (l1, g1) = run(None), run("x86-64-v3")
    assert torch.equal(l0, l1) and all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True))
