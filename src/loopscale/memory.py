"""Memory of one training step: the one source of the micro-batch rule (arXiv 2604.21106 trains 128 rows of T = 2048).

Pure functions of a ModelConfig, like ``loopscale.accounting``: nothing here builds a model; torch is
imported only to ask a device for its size. A run's micro-batches (its TrainConfig meets these terms) are
planned in ``loopscale.train.microbatch``. ``tests/test_memory.py`` checks the terms against what autograd
saves and what a CPU training step allocates (fp32 and bf16 autocast, every injection, truncated BPTT, math
attention), and pins the CUDA prediction at paper scale.

A step peaks at the start of backward (every activation of the micro-batch is still saved) or in
the optimiser step::

    peak(rows) = state + max(rows T (A + L_bwd) + W_fwd,  S_opt)
    state      = 4N weights + 4N grads + 4 N_matrix MuonH momentum + 8 N_adam AdamW moments (fp32)
                 (+ 4N DDP gradient buckets with several processes; the grads are not yet live at the
                 first backward of a step that runs a single forward)

**A, bytes per token kept for backward**, read off model/layers.py and model/looped.py op by op. ``a``
is the size of a matmul output (2 under bf16 autocast, 4 in fp32), ``m = mlp_ratio``, ``H`` heads.
One block application with gradients keeps::

    4d + 4     norm1's input in fp32 (autocast runs rms_norm in fp32) and 1/rms
    a d        the normed x as the fused q/k/v GEMM's input (its bf16 cast under autocast)
    3a d       the q/k/v output, whole: v and the RoPE halves are views of it
    8d + 8H    QK-norm's input (the RoPE output) and 1/rms per head of q and k: CPU's composite norm
               upcasts it to fp32; CUDA's fused norm keeps it in a (2a d + 8H), the model running
               QK-norm outside autocast
    2a d       q and k as SDPA saves them (normed, cast to a)
    a d + 4H   SDPA's output and logsumexp: the flash/efficient kernels (CUDA) and torch's CPU flash
               kernel keep O(T) per row, not the T x T matrix
    a d        the head-merged copy the out projection saves (``y.transpose(1, 2).reshape``)
    4d + 4     norm2's input (x + attn) and 1/rms;  a d  its output, the MLP's input
    2m a d     ReLU's output and its square (the square as proj's input)
    8d         composite RMSNorm only (CPU; CUDA without torch's fused rms_norm, pytorch/pytorch#153666):
               x / rms of both weighted norms, for the weights' gradient
    = d (16 + 9a + 2ma) + 12H + 8 (+ 8d composite): CPU fp32 92d; CUDA bf16 (2a d QK-norm input) 46d
    per token. (The square is a product, ``h * h``: CUDA autocast would run ``pow`` in fp32 and keep
    another 4md.)
    math SDPA instead: scaled q, k and a copy of v (3a d) and the probabilities (H T a), no q/k/v output

On CPU in fp32 the model runs model/fused.py's functions instead (``Regime.fused_cpu``): the norms keep
their input and 1/rms (4d + 4 each); attention the GEMM input, rope_qk_norm's output (normed q and k and
v's copy, 3a d, which SDPA's saved q, k, v are views of) with 1/rms per head (8H), SDPA's output and
logsumexp (a d + 4H; the out projection's input is a view of it, no merged copy; model/cpu_kernels.c's
attention keeps the same); the MLP its input and relu(fc x) (a d + m a d): 8d + 8 + 7a d + m a d + 12H,
**52 d** in fp32.

A recurrence with gradients adds norm_recur (4d + 4, + 4d composite) and its injection's input: linear
``[e || h]`` (2a d); hyperconnect the K lanes for its two lane mixes (4Kd, or a bf16 cast per mix
under autocast, 2aKd) and the normed output that beta scales; additive and passthrough save nothing.
Once per token: ids and targets (16), norm_emb and norm_final (4d + 4 each, + 4d composite) and the
loss path. The fused loss (``model/loss.py``, the default) computes its gradients in the forward and
keeps the gradient of its input, 4d; the plain path (``run.fused_loss = false``) keeps the head's
input (a d) and, over the *real* vocabulary V in fp32, tanh's output (softcap) and log-softmax's
output, 4V each. Full BPTT keeps ``n_prelude + r n_recur + n_coda`` block applications and
r recurrences; truncated BPTT ``n_prelude + k n_recur + n_coda`` and k (the rest run under no_grad).

**L_bwd** (per token): the last block's squared-ReLU backward (its gradient 2hg in place, m a d); on the plain loss path
log-softmax's incoming and outgoing fp32 gradients (8V) where larger. The fused loss's temporaries
come per micro-batch on top: while the forward computes it, one chunk's fp32 logits and softmax (``c``
rows of ``model.chunks.LOSS_CHUNK_BYTES`` at most, (8 + 2) V bytes per row under autocast), the head's cast and its
gradient's matmul output; at backward's start its two scaled gradients (4d per token, 4Vd).
**W_fwd** (per micro-batch): the concatenated q/k/v weight per block application (3d^2 a) and, under
autocast, the cached bf16 casts of the other weights and RoPE's tables cast per application; with the
fused loss the fp32 head gradient (4Vd), which exists from the forward on.
**S_opt**: MuonH's largest bucket of same-shape matrices (P parameters, n matrices m x M, m <= M): the
lerped updates and their stack (8P), the orthogonalisation's X, aX, BX, new X and the m x m Gram
matrices in the ns dtype s, ``8P + s (4P + 2 n m^2)`` (in fp32 ``baddbmm`` forms a X + B X in one GEMM:
``8P + s (2P + 2 n m^2)``), or after it the stacked weights and their two updates ``16P + 2sP``;
AdamW's foreach temporaries on CPU (8 bytes per AdamW parameter; CUDA's fused AdamW has none).

**Validation** (no grad) keeps nothing: per token the loss path at once (fp32 logits, their /softcap
copy, tanh: 12V) or a block's MLP while the key/value tuples of this block and the one before (v keeps
the q/k/v output) and the residual streams are alive, on top of the weights, optimiser state and
autocast's weight casts.

Left out: kernel workspaces that never become tensors (cuBLAS, attention scratch), the CUDA context,
allocator fragmentation. They are the margin of :func:`usable_memory`: 10 % of the device and 1 GiB.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from loopscale import accounting
from loopscale.config import ModelConfig
from loopscale.model.chunks import chunk_rows, mlp_chunk_rows  # the model's chunk sizes

MARGIN_FRACTION = 0.10  # of a GPU: allocator fragmentation, cuBLAS and attention workspaces
MARGIN_BYTES = 2**30  # the CUDA context and NCCL buffers, outside torch's allocator
CPU_FRACTION = 0.5  # of a host's physical memory: it also holds the token data and other runs


# ---- where the step runs -----------------------------------------------------------------
@dataclass(frozen=True)
class Regime:
    """Device and autocast dtype, which decide what autograd keeps and in which dtype.

    ``attention``: ``flash`` (the fused SDPA kernels both devices pick for causal training) or ``math``.
    ``fused_norm``: None = the device's rms_norm (CUDA fused, CPU composite).
    """

    device: str = "cuda"  # "cuda" | "cpu"
    dtype: str = "bfloat16"  # "bfloat16" | "float32"
    attention: str = "flash"
    fused_norm: bool | None = None
    fused_loss: bool = True  # model/loss.py's chunked head + softcap + cross-entropy (``run.fused_loss``)
    cpu_kernels: bool | None = None  # model/fused.py's functions; None = where the model uses them

    @property
    def fused_cpu(self) -> bool:
        """Whether the model runs model/fused.py's functions (CPU without autocast, ``fused.use_fused``)."""
        return self.device == "cpu" and not self.autocast if self.cpu_kernels is None else self.cpu_kernels

    @property
    def a(self) -> int:
        """Bytes per element of a matmul output."""
        return 2 if self.autocast else 4

    @property
    def autocast(self) -> bool:
        return self.dtype == "bfloat16"

    @property
    def cuda_autocast(self) -> bool:
        """CUDA's autocast runs the weighted norms' rms_norm in fp32; CPU's does not (the model keeps
        QK-norm out of autocast and squares with a product, so neither upcasts)."""
        return self.autocast and self.device == "cuda"

    @property
    def composite_norm(self) -> bool:
        if self.fused_cpu:
            return False  # fused.rms_norm keeps its input and 1/rms, as CUDA's fused kernel
        return not (self.device == "cuda" if self.fused_norm is None else self.fused_norm)

    @property
    def norm_out(self) -> int:
        """Bytes per element of an RMSNorm's output on a bf16 input (CPU's casts back to bf16)."""
        return self.a if self.autocast and not self.cuda_autocast else 4


def regime(device: str, dtype: str = "auto", attention: str = "flash", *, fused_loss: bool = True) -> Regime:
    """A run's regime: ``dtype = auto`` is bf16 on CUDA, fp32 on CPU (as ``train.hardware``)."""
    dev = "cuda" if str(device).startswith("cuda") else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if dev == "cuda" else "float32"
    return Regime(dev, dtype, attention, fused_loss=fused_loss)


# ---- activations (bytes per token) ----------------------------------------------------------
def _norm(d: int, rg: Regime) -> int:
    """A weighted RMSNorm: its fp32 input and 1/rms, and x / rms where the norm is composite."""
    return 4 * d + 4 + (4 * d if rg.composite_norm else 0)


def _unique_blocks(cfg: ModelConfig) -> int:
    return cfg.n_prelude + cfg.n_recur + cfg.n_coda if cfg.is_looped else cfg.L_eff


def block_bytes(cfg: ModelConfig, rg: Regime) -> float:
    """Bytes per token one block application keeps for backward (the table in the module docstring)."""
    d, h, m, a = cfg.width, cfg.n_head, cfg.mlp_ratio, rg.a
    if rg.fused_cpu:
        # GEMM input; fused.rope_qk_norm's output (normed q and k, v's copy: SDPA saves views of it) and
        # 1/rms per head of q and k. SDPA's output is laid out [B, T, H, hd], so the out projection's
        # input is a view of it (no merged copy).
        attn = a * d + (3 * a * d + 8 * h)
        attn += a * d + 4 * h if rg.attention == "flash" else 3 * a * d + h * cfg.seq_len * a + a * d
        return float(2 * _norm(d, rg) + attn + a * d + m * a * d)
    qk_in = 8 * d if rg.composite_norm else 2 * a * d  # QK-norm's input: upcast by the composite norm
    attn = a * d + (qk_in + 8 * h) + a * d  # GEMM input; QK-norm's input and 1/rms; the merged copy
    if rg.attention == "flash":
        attn += 3 * a * d + 2 * a * d + a * d + 4 * h  # q/k/v output, normed q and k, output, logsumexp
    else:
        attn += 3 * a * d + h * cfg.seq_len * a  # scaled q and k, a copy of v; the T x T probabilities
    mlp = a * d + 2 * m * a * d
    return float(2 * _norm(d, rg) + attn + mlp)


def loop_bytes(cfg: ModelConfig, rg: Regime) -> float:
    """Bytes per token one recurrence with gradients keeps besides its blocks: norm_recur and the injection."""
    if not cfg.is_looped:
        return 0.0
    d = cfg.width
    inject = 0
    if cfg.builtin_injection == "linear":
        inject = 2 * rg.a * d
    elif cfg.builtin_injection == "hyperconnect":
        k = cfg.hc_lanes
        inject = (2 * rg.a * k * d if rg.autocast else 4 * k * d) + rg.norm_out * d
    return float(_norm(d, rg) + inject)


def grad_applications(cfg: ModelConfig) -> tuple[int, int]:
    """(block applications, recurrences) that keep activations: all, or the last k under truncated BPTT."""
    if not cfg.is_looped:
        return cfg.L_eff, 0
    k = cfg.k_grad
    return cfg.n_prelude + k * cfg.n_recur + cfg.n_coda, k


def logits_bytes(cfg: ModelConfig, rg: Regime) -> float:
    """The loss path per token: the fused loss keeps the gradient of its input (fp32, 4d); the plain one
    the head's input and, over the real vocabulary in fp32, tanh's output (softcap) and log-softmax's."""
    if rg.fused_loss:
        return float(4 * cfg.width)
    return float(rg.a * cfg.width + 4 * cfg.vocab_size * (2 if cfg.softcap is not None else 1))


def activation_bytes(cfg: ModelConfig, rg: Regime) -> float:
    """A: bytes per token kept for backward."""
    d = cfg.width
    blocks, recurrences = grad_applications(cfg)
    ends = 16 + 2 * _norm(d, rg)  # ids and targets; norm_emb, norm_final
    return ends + blocks * block_bytes(cfg, rg) + recurrences * loop_bytes(cfg, rg) + logits_bytes(cfg, rg)


def backward_transient_bytes(cfg: ModelConfig, rg: Regime, tokens: int = 1) -> float:
    """L_bwd, per token of a micro-batch of ``tokens``: the last squared-ReLU backward, or (plain loss, large
    vocabularies) log-softmax's two fp32 gradients. model/fused.py's MLP instead peaks with its input's
    gradient (a d per token), proj's weight gradient and one chunk's two [rows, m d] gradients."""
    d, m = cfg.width, cfg.mlp_ratio
    block: float = m * rg.a * d  # the squared ReLU's gradient, 2 h g, computed in place (model/layers.py)
    if rg.fused_cpu:
        chunk = min(mlp_chunk_rows(m * d), tokens)
        block = rg.a * d + (2 * chunk * m * d * rg.a + m * d * d * 4) / tokens
    return float(block if rg.fused_loss else max(8 * cfg.vocab_size, block))


def loss_transient_bytes(cfg: ModelConfig, rg: Regime, tokens: int) -> float:
    """The fused loss's temporaries (model/loss.py) while every activation is saved: one chunk's fp32
    logits and softmax (+ their bf16 casts), the head's cast and its gradient's matmul output; then at
    backward's start the two scaled gradients (4d per token and 4Vd). 0 for the plain loss path."""
    if not rg.fused_loss:
        return 0.0
    d, v = cfg.width, cfg.vocab_size
    c = chunk_rows(v, tokens)
    per_row = (4 if cfg.softcap is not None else 0) + (6 if rg.autocast else 4)
    forward = c * v * per_row + v * d * (8 if rg.autocast else 4) + 4 * c * d
    return float(max(forward, tokens * 4 * d + 4 * v * d))


def cached_cast_bytes(cfg: ModelConfig, rg: Regime, *, head: bool = True) -> float:
    """Autocast's cache of bf16 weight copies (leaf weights: out, MLP, injection, head), held through the
    forward and then by autograd; the concatenated q/k/v weight is no leaf and is cast at every use.
    ``head``: the plain loss path casts the head through autocast; the fused one casts a slice itself."""
    if not rg.autocast:
        return 0.0
    d = cfg.width
    inject = 2 * d * d if cfg.is_looped and cfg.builtin_injection == "linear" else 0
    head_cast = cfg.vocab_padded * d if head else 0
    return float((_unique_blocks(cfg) * (1 + 2 * cfg.mlp_ratio) * d * d + inject + head_cast) * rg.a)


def weight_copy_bytes(cfg: ModelConfig, rg: Regime) -> float:
    """W_fwd: weight copies one forward keeps: the q/k/v concat per application (and RoPE's cast tables),
    autocast's cached casts, and the fused loss's fp32 head gradient (computed in the forward)."""
    blocks, _ = grad_applications(cfg)
    per_use = 3 * cfg.width * cfg.width * rg.a + (cfg.seq_len * cfg.head_dim * rg.a if rg.autocast else 0)
    tables = 4 * max(cfg.seq_len, 64) * cfg.head_dim if rg.fused_cpu else 0  # Rotary.turn (cached)
    head_grad = 4 * cfg.vocab_size * cfg.width if rg.fused_loss else 0
    return blocks * per_use + tables + cached_cast_bytes(cfg, rg, head=not rg.fused_loss) + head_grad


def eval_bytes(cfg: ModelConfig, rg: Regime) -> float:
    """Bytes per token at a no-grad forward's worst moment: the loss path, or a block's MLP."""
    d, m, a, v = cfg.width, cfg.mlp_ratio, rg.a, cfg.vocab_size
    loss = (4 * cfg.vocab_padded + 8 * v if a == 4 else 12 * v) + 4 * d  # logits, /softcap, tanh; last x
    # a block's attention (q, k, v and their normed copies) or its MLP, whichever is larger: blocks return
    # no (k, v) without a KV cache, so the attention's tensors are gone by the time the MLP runs
    kv = 5 * a * d  # the q/k/v output and the normed q and k
    mlp = 2 * m * a * d  # ReLU's output and its square
    residuals = 4 * d * (4 + (1 if cfg.is_looped else 0))  # x, its norm, the block input; the loop's e
    if cfg.is_looped and cfg.builtin_injection == "hyperconnect":
        residuals += 4 * d * (cfg.hc_lanes - 1)
    return float(max(loss, max(kv, mlp) + residuals))


# ---- parameters and optimiser state (bytes) -------------------------------------------------
def matrix_params(cfg: ModelConfig) -> int:
    """Parameters MuonH updates: the blocks' matrices and the linear injection's (hyperconnect's are AdamW's)."""
    inject = accounting.injection_params(cfg) if cfg.is_looped and cfg.builtin_injection == "linear" else 0
    return _unique_blocks(cfg) * accounting.block_params(cfg) + inject


def state_bytes(cfg: ModelConfig, *, optim: str = "muonh", world: int = 1, grads: bool = True) -> float:
    """fp32 weights, their grads (and DDP's gradient buckets), MuonH momentum and AdamW moments."""
    n = accounting.N_total(cfg)
    n_matrix = matrix_params(cfg) if optim == "muonh" else 0
    moments = 4 * n_matrix + 8 * (n - n_matrix)
    grad = (4 * n + (4 * n if world > 1 else 0)) if grads else 0
    return float(4 * n + grad + moments)


def _muon_buckets(cfg: ModelConfig) -> list[tuple[int, int, int]]:
    """MuonH's buckets as (matrices, m, M), m <= M: it stacks same-shape matrices, tall ones transposed."""
    d, m, unique = cfg.width, cfg.mlp_ratio, _unique_blocks(cfg)
    buckets = {(d, d): 4 * unique}
    buckets[(d, m * d)] = buckets.get((d, m * d), 0) + 2 * unique
    if cfg.is_looped and cfg.builtin_injection == "linear":
        buckets[(d, 2 * d)] = buckets.get((d, 2 * d), 0) + 1
    return [(n, lo, hi) for (lo, hi), n in buckets.items()]


def optimizer_transient_bytes(cfg: ModelConfig, rg: Regime, *, optim: str = "muonh", ns_dtype: str = "auto") -> float:
    """S_opt: the optimiser step's temporaries (module docstring)."""
    n_adam = accounting.N_total(cfg) - (matrix_params(cfg) if optim == "muonh" else 0)
    adam = 0.0 if rg.device == "cuda" else 8.0 * n_adam
    if optim != "muonh":
        return adam
    s = 2 if ns_dtype == "bfloat16" or (ns_dtype == "auto" and rg.device == "cuda") else 4
    worst = 0.0
    for n, lo, hi in _muon_buckets(cfg):
        p = n * lo * hi
        xs = 2 if s == 4 else 4  # X and new X (fp32 baddbmm), or also a X and B X (bf16, the paper's order)
        worst = max(worst, 8 * p + s * (xs * p + 2 * n * lo * lo), 16 * p + 2 * s * p)
    return max(worst, adam)


# ---- peaks ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Peak:
    """Predicted peak bytes of one process, by term."""

    rows: int
    state: float  # weights, grads, optimiser state
    activations: float  # kept for backward, with the forward's weight copies (validation: 0)
    transient: float  # the worst moment's temporaries on top
    optimizer: float  # the optimiser step's temporaries (validation: 0)

    @property
    def total(self) -> float:
        return self.state + max(self.activations + self.transient, self.optimizer)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


def train_peak(
    cfg: ModelConfig,
    rows: int,
    rg: Regime,
    *,
    optim: str = "muonh",
    ns_dtype: str = "auto",
    world: int = 1,
    accumulate: bool = True,
) -> Peak:
    """Peak of a training step whose forward passes take ``rows`` rows of T tokens each.

    ``accumulate``: several forwards per step, so earlier forwards' grads are live at a later backward's
    start (with one forward per step they appear only as its activations are freed).
    """
    tokens = rows * cfg.seq_len
    state = state_bytes(cfg, optim=optim, world=world)
    grads = 0.0 if accumulate else state - state_bytes(cfg, optim=optim, world=world, grads=False)
    return Peak(
        rows,
        state,
        tokens * activation_bytes(cfg, rg) + weight_copy_bytes(cfg, rg) - grads,
        max(tokens * backward_transient_bytes(cfg, rg, tokens), loss_transient_bytes(cfg, rg, tokens)),
        optimizer_transient_bytes(cfg, rg, optim=optim, ns_dtype=ns_dtype),
    )


def eval_peak(cfg: ModelConfig, rows: int, rg: Regime, *, optim: str = "muonh", world: int = 1) -> Peak:
    """Peak of a no-grad validation forward over ``rows`` rows, beside the weights and optimiser state."""
    state = state_bytes(cfg, optim=optim, world=world, grads=False)
    return Peak(rows, state, 0.0, rows * cfg.seq_len * eval_bytes(cfg, rg) + cached_cast_bytes(cfg, rg), 0.0)


# ---- devices --------------------------------------------------------------------------------
def usable_memory(total: float, device: str = "cuda") -> int:
    """Bytes a process may plan for on a device of ``total`` bytes: a GPU less 10 % and 1 GiB (what
    the model leaves out), half of a CPU host."""
    if str(device).startswith("cuda"):
        return max(0, int(total * (1 - MARGIN_FRACTION)) - MARGIN_BYTES)
    return int(total * CPU_FRACTION)


def device_total_memory(device: str) -> int | None:
    """A CUDA device's total memory (torch), or the host's physical memory for ``cpu``; None if unknown.

    Without an NVIDIA driver on the host there is no CUDA device to ask, and torch (a 1.5 s import) is
    not loaded to find that out: ``sweep plan`` stays light on CPU machines.
    """
    if str(device).startswith("cuda"):
        from loopscale import cores

        if not cores.nvidia_driver():
            return None
        import torch

        if not torch.cuda.is_available():
            return None
        index = int(str(device).split(":")[1]) if ":" in str(device) else torch.cuda.current_device()
        return int(torch.cuda.get_device_properties(index).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


_UNITS = {
    "": 1e9,
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(text: str | float) -> int:
    """``80GB`` (1e9 bytes), ``79.6GiB`` (2^30), ``8e10B``, or a bare number of GB."""
    if isinstance(text, int | float):
        return int(text * 1e9)
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)", str(text).strip().lower())
    if m is None or m.group(2) not in _UNITS:
        raise ValueError(f"expected a size such as 80GB or 79.6GiB, got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def fmt_bytes(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


# ---- micro-batches: the largest that fits (``loopscale.train.microbatch`` plans a run's) ------------
def largest_fitting(rows: int, limit: float, peak_of: Callable[[int], Peak], *, at_least: int = 1) -> int | None:
    """The largest divisor of ``rows`` (at least ``at_least``) whose peak is within ``limit``."""
    for k in range(rows, at_least - 1, -1):
        if rows % k == 0 and peak_of(k).total <= limit:
            return k
    return None
