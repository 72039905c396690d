"""The looped model behaves as arXiv 2604.21106 §2 describes."""

import pytest
import torch

from loopscale import accounting as acc
from loopscale.config import ModelConfig
from loopscale.errors import ConfigError
from loopscale.model import KVCache, LoopedLM


def tiny(r: int = 4, **kw) -> ModelConfig:
    base = {"d_model": 32, "head_dim": 8, "L_eff": 12, "r": r, "seq_len": 24, "vocab_size": 100}
    return ModelConfig(**{**base, **kw})


def tokens(B: int = 2, T: int = 24) -> torch.Tensor:
    return torch.randint(0, 100, (B, T), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("r", [1, 2, 4, 8])
@pytest.mark.parametrize("injection", ["linear", "additive", "passthrough", "hyperconnect"])
def test_real_parameter_groups_equal_the_accounting(r: int, injection: str) -> None:
    cfg = tiny(r, injection=injection)
    counted = LoopedLM(cfg).count_params()
    assert counted == {
        "N_once": acc.N_once(cfg),
        "N_rec": acc.N_rec(cfg),
        "N_emb": acc.N_emb(cfg),
        "N_norm": acc.N_norm(cfg),
        "N_total": acc.N_total(cfg),
    }


@pytest.mark.parametrize("injection", ["linear", "additive"])
def test_r1_looped_is_a_loop_of_one_with_the_loops_extra_parameters(injection: str) -> None:
    plain, loop1 = tiny(1, injection=injection), tiny(1, injection=injection, r1_looped=True)
    assert loop1.layout == f"{loop1.n_prelude}+{loop1.n_recur}x1+{loop1.n_coda}" and plain.layout.endswith("unique")
    extra = 2 * loop1.width**2 if injection == "linear" else 0
    assert acc.N_rec(loop1) == acc.N_rec(plain) + extra and acc.N_once(loop1) == acc.N_once(plain)
    assert LoopedLM(loop1).count_params()["N_total"] == acc.N_total(plain) + extra + loop1.width  # + norm_recur
    m = LoopedLM(loop1)
    assert m(tokens()).shape[:2] == (2, 24) and m(tokens(), r=3).shape[:2] == (2, 24)  # r can vary at eval


def test_param_groups_cover_every_parameter_once() -> None:
    for injection in ("linear", "hyperconnect"):
        m = LoopedLM(tiny(4, injection=injection))
        grouped = [p for ps in m.param_groups().values() for p in ps]
        assert len(grouped) == len({id(p) for p in grouped}) == len(list(m.parameters()))
    g = LoopedLM(tiny(4, injection="hyperconnect")).param_groups()
    assert len(g["scalar"]) == 3 and all(p.dim() == 2 for p in g["matrix"])


def test_vocab_is_padded_to_a_multiple_of_64_but_logits_cover_the_real_vocabulary_only() -> None:
    cfg = ModelConfig(s=2, head_dim=32, vocab_size=257, L_eff=6, r=2)
    assert cfg.width == 128 and cfg.vocab_padded == 320
    model = LoopedLM(cfg)
    assert model.head.weight.shape == (320, 128)
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 257)


def test_the_loss_ignores_padded_vocabulary_ids_as_the_papers_code_does() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, head_dim=16, vocab_size=70, L_eff=4, r=2, n_prelude=1, n_coda=1, seq_len=8)
    model = LoopedLM(cfg)
    x, y = torch.randint(0, 70, (2, 8)), torch.randint(0, 70, (2, 8))
    before = model(x, y)
    with torch.no_grad():  # padded head rows that would dominate a softmax over all 128 ids
        model.head.weight[70:].fill_(1.0)
    torch.testing.assert_close(model(x, y), before, rtol=0, atol=0)
    logits = model(x)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 70), y.reshape(-1))
    torch.testing.assert_close(before, expected, rtol=0, atol=0)
    per_token = model(x, y, reduction="none")
    assert per_token.shape == (16,) and torch.allclose(per_token.mean(), expected)
    y[0, 0] = -1  # ignored target
    assert torch.isfinite(model(x, y))


def test_init_follows_the_paper() -> None:
    m = LoopedLM(ModelConfig(d_model=256, head_dim=64, L_eff=6, r=2, vocab_size=5000))
    assert m.embed.weight.std().item() == pytest.approx(1.0, rel=0.02)
    assert m.head.weight.std().item() == pytest.approx(1e-3, rel=0.02)
    b = m.recur[0]
    assert b.attn.q.weight.abs().max().item() <= 3**0.5 / 256**0.5
    assert b.mlp.proj.weight.abs().max().item() <= 3**0.5 / 1024**0.5
    assert b.mlp.proj.weight.abs().max().item() > 0.9 * 3**0.5 / 1024**0.5
    W = m.inject.weight
    assert torch.equal(W, torch.cat([torch.eye(256), torch.zeros(256, 256)], dim=1))


def test_linear_injection_init_makes_first_recurrent_input_equal_e() -> None:
    m = LoopedLM(tiny(4))
    seen = {}
    m.recur[0].register_forward_pre_hook(lambda mod, args: seen.setdefault("u0", args[0].detach()))
    x = tokens()
    with torch.no_grad():
        e = m._stack(m.prelude, m.norm_emb(m.embed(x)), None)
        m(x)
    torch.testing.assert_close(seen["u0"], e)


def test_logits_are_softcapped_at_15_in_fp32() -> None:
    m = LoopedLM(tiny(2))
    with torch.no_grad():
        m.head.weight.normal_(0, 10.0)
        logits = m(tokens())
    assert logits.dtype == torch.float32
    assert logits.abs().max().item() <= 15.0 and logits.abs().max().item() > 14.0


@pytest.mark.parametrize("r", [2, 4])
def test_hyperconnect_at_init_equals_plain_residual_loop(r: int) -> None:
    K = 3
    m = LoopedLM(tiny(r, injection="hyperconnect", hc_lanes=K))
    x = tokens()
    with torch.no_grad():
        got = m(x)
        e = m._stack(m.prelude, m.norm_emb(m.embed(x)), None)
        h = e
        for _ in range(r):  # every lane carries the same stream h <- h + norm_recur(recur(h))
            h = h + m.norm_recur(m._stack(m.recur, h, None))
        y = m._stack(m.coda, K * h, None)
        ref = 15 * torch.tanh(m.head(m.norm_final(y))[..., : m.cfg.vocab_size].float() / 15)
    torch.testing.assert_close(got, ref)


def _recur_grads(m: LoopedLM, x: torch.Tensor) -> list[torch.Tensor]:
    m.zero_grad()
    m.loss(x, x).backward()
    return [p.grad.clone() for p in list(m.recur.parameters()) + list(m.inject.parameters())]


@pytest.mark.parametrize(("r", "k"), [(4, 2), (8, 4), (8, 1)])
def test_truncated_bptt_gradient_equals_detached_reference(r: int, k: int) -> None:
    x = tokens()
    m = LoopedLM(tiny(r, bptt_k=k))
    with torch.no_grad():  # move W off [I|0] so the state path carries gradient; a non-tiny head
        m.inject.weight.add_(0.3 * torch.randn_like(m.inject.weight))
        m.head.weight.normal_(0, 0.3)
    got = _recur_grads(m, x)

    ref_model = LoopedLM(tiny(r))
    ref_model.load_state_dict(m.state_dict())

    def ref_loop(e: torch.Tensor, r_: int, cache: KVCache | None) -> torch.Tensor:
        h = e
        for i in range(r_):
            if i == r_ - k:
                h = h.detach()  # hand-built truncation: earlier recurrences get no gradient
            h = ref_model.norm_recur(ref_model._stack(ref_model.recur, ref_model.inject.input(i, e, h), None))
        return h

    ref_model._loop = ref_loop  # type: ignore[method-assign]
    want = _recur_grads(ref_model, x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)
    full = LoopedLM(tiny(r))
    full.load_state_dict(m.state_dict())
    rel = [((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, _recur_grads(full, x), strict=True)]
    assert max(rel) > 1e-3  # and truncation really changes the gradient


def test_bptt_k_equal_r_is_full_backprop() -> None:
    x = tokens()
    a, b = LoopedLM(tiny(4, bptt_k=4)), LoopedLM(tiny(4))
    b.load_state_dict(a.state_dict())
    for g, h in zip(_recur_grads(a, x), _recur_grads(b, x), strict=True):
        torch.testing.assert_close(g, h)


def test_changing_r_at_evaluation_changes_outputs_and_runs() -> None:
    m = LoopedLM(tiny(4)).eval()
    with torch.no_grad():
        m.inject.weight.add_(0.1 * torch.randn_like(m.inject.weight))
        out = {r: m(tokens(), r=r) for r in (1, 2, 4, 6, 8)}
    assert all(o.shape == out[4].shape and torch.isfinite(o).all() for o in out.values())
    assert all((out[r] - out[4]).abs().max() > 1e-4 for r in (1, 2, 6, 8))


def test_r_override_is_refused_where_it_has_no_meaning() -> None:
    with pytest.raises(ConfigError, match="plain stack"):
        LoopedLM(tiny(1))(tokens(), r=2)
    with pytest.raises(ConfigError, match="hyperconnect"):
        LoopedLM(tiny(2, injection="hyperconnect"))(tokens(), r=4)


@pytest.mark.parametrize("r", [1, 2, 4, 8])
@pytest.mark.parametrize("injection", ["linear", "hyperconnect"])
def test_kv_cached_decoding_reproduces_full_sequence_logits(r: int, injection: str) -> None:
    m = LoopedLM(tiny(r, injection=injection)).eval()
    with torch.no_grad():
        if r > 1 and injection == "linear":
            m.inject.weight.add_(0.1 * torch.randn_like(m.inject.weight))
        x = tokens(2, 20)
        full = m(x)
        cache = KVCache()
        parts = [m(x[:, :7], cache=cache), m(x[:, 7:12], cache=cache)]  # a prefix, then a chunk
        parts += [m(x[:, t : t + 1], cache=cache) for t in range(12, 20)]  # then token by token
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-4, atol=1e-4)
    assert len(cache.slots) == acc.ModelConfig.model_validate(m.cfg.model_dump()).L_eff
    assert cache.length == 20


def test_kv_cache_at_eval_r_keeps_one_slot_per_block_application() -> None:
    m = LoopedLM(tiny(4)).eval()
    x = tokens(1, 10)
    with torch.no_grad():
        full = m(x, r=6)
        cache = KVCache()
        steps = [m(x[:, :4], r=6, cache=cache)] + [m(x[:, t : t + 1], r=6, cache=cache) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-4)
    assert len(cache.slots) == 2 + 6 * 2 + 2


def test_kv_cache_slots_grow_geometrically_without_copying_the_prefix_every_token() -> None:
    m = LoopedLM(tiny(2)).eval()
    x = tokens(1, 40)
    cache = KVCache()
    caps, buffers = [], set()
    with torch.no_grad():
        m(x[:, :3], cache=cache)
        for t in range(3, 40):
            m(x[:, t : t + 1], cache=cache)
            caps.append(cache.slots[0].capacity)
            buffers.add(cache.slots[0].k.data_ptr())
    assert sorted(set(caps)) == [6, 12, 24, 48] and len(buffers) == 4  # 4 reallocations for 37 tokens
    assert cache.length == 40 and all(s.length == 40 for s in cache.slots)


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # RMSNorm under CPU autocast
def test_kv_cache_keeps_keys_in_the_compute_dtype() -> None:
    from loopscale.model.layers import KVSlot

    slot = KVSlot()
    k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8, dtype=torch.bfloat16)
    k_all, v_all = slot.append(k, v)  # autocast on CUDA can hand over fp32 keys (QK-norm) with bf16 values
    assert k_all.dtype == v_all.dtype == torch.bfloat16 and torch.equal(k_all, k.to(torch.bfloat16))
    m = LoopedLM(tiny(2)).eval()
    x = tokens(2, 12)
    cache = KVCache()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = m(x)
        steps = [m(x[:, :6], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(6, 12)]
    assert {s.k.dtype for s in cache.slots} == {torch.bfloat16}
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0.05, atol=0.05)


def test_greedy_generate_matches_argmax_of_full_forward() -> None:
    m = LoopedLM(tiny(2)).eval()
    x = tokens(1, 6)
    out = m.generate(x, 5)
    seq = x
    with torch.no_grad():
        for _ in range(5):
            nxt = m(seq)[:, -1, :100].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
    assert torch.equal(out, seq[:, 6:])


def test_the_fused_loss_matches_the_plain_path_and_computes_no_gradient_without_a_graph(monkeypatch) -> None:
    """model/loss.py: the same loss and gradients as plain autograd over the logits (chunked or not), and
    under no_grad only the loss (apply() still reports requires_grad there; the gradient pass would be waste)."""
    from loopscale.model import loss as fused

    g = torch.Generator().manual_seed(0)
    h = torch.randn(50, 16, generator=g, requires_grad=True)
    w = torch.randn(30, 16, generator=g, requires_grad=True)
    t = torch.randint(0, 30, (50,), generator=g)
    t[3] = -1
    z = 15 * torch.tanh(h @ w.t() / 15)
    ref = torch.nn.functional.cross_entropy(z, t, ignore_index=-1)
    ref_grads = torch.autograd.grad(ref, (h, w))
    for chunk in (7, None):
        out = fused.softcap_cross_entropy(h, w, t, softcap=15.0, chunk=chunk)
        assert float(out.detach()) == pytest.approx(float(ref.detach()), rel=1e-6)
        for a, b in zip(torch.autograd.grad(out, (h, w)), ref_grads, strict=True):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    matmuls: list[int] = []
    real_mm = torch.Tensor.__matmul__
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: matmuls.append(1) or real_mm(a, b))
    with torch.no_grad():
        out = fused.softcap_cross_entropy(h, w, t, softcap=15.0, chunk=7)
    assert float(out.detach()) == pytest.approx(float(ref.detach()), rel=1e-6)
    assert len(matmuls) == 8  # the logits of each of the 8 chunks, no gradient products
