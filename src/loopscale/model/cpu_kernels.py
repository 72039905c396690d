"""``cpu_kernels.c``: compiled with the system C compiler on first use, cached, called through ctypes.

The fused CPU functions (``fused.py``) cut a step's elementwise passes with torch ops, but RoPE + QK-norm
still ran as about fifteen small ops per block and RMSNorm as six: eager torch has no single CPU kernel
for either. Forward + backward on [16, 256, 128] (issue 20's shape, 2 threads): RoPE + QK-norm 6.4-7.0 ms
with torch ops, 2.5-2.7 ms here (nanoGPT's q/k/v split: 1.0 ms); RMSNorm 1.5-1.8 ms, 0.7 ms here
(LayerNorm: 0.7 ms). The C file does each in one pass per direction (``bench/RESULTS.md``, issue 20). It
also holds causal attention on RoPE's packed output (``attention_fwd``/``attention_bwd``): torch's CPU flash
kernel runs small BLAS calls per block, and at head size 32 forward + backward took 28.7 ms against 16.4 here.

A plain C file, not a torch extension: it needs only ``cc`` (no torch headers, no ninja; about 8 s to
compile, once per source, compiler and CPU, into ``<LOOPSCALE_CACHE>/kernels``) and runs on raw fp32
buffers. Without a compiler, or with ``LOOPSCALE_CPU_KERNELS=off``, ``library()`` is None and ``fused.py``
keeps its torch ops: the same formulas, slower. ``status()`` says which; runs record it (``hardware_info``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

from loopscale.errors import ConfigError
from loopscale.io import cache_dir

SOURCE = Path(__file__).with_name("cpu_kernels.c")
ENV = "LOOPSCALE_CPU_KERNELS"
#: the instruction set the kernels are built for (``-march=VALUE``; default ``native``), e.g. ``x86-64-v3``
#: (AVX2) on an AVX-512 machine: the kernels' vectors are 8 lanes whatever the instruction set, so such a
#: build gives the native one's bits, which the test suite checks (docs/model.md, docs/testing.md).
MARCH_ENV = "LOOPSCALE_CPU_MARCH"
FLAGS = ("-O3", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math")
#: with a ``-march``: the instruction set's extensions, but the generic cost model. Why: ``-march=native`` also
#: tunes for this CPU, and on an AMD EPYC (Zen 3, AVX2 only) that tuning splits FMA chains (GCC's
#: ``avoid_fma_chains``), so its build rounded differently from an ``x86-64-v3`` one (measured: gradients 1e-7
#: apart); with the generic model both contract ``a*b+c`` the same way.
TUNE = "-mtune=generic"
#: tried in order until one compiles: OpenMP (torch's own thread pool) and this CPU's vector units first
VARIANTS = (("-fopenmp", "-march=native", TUNE), ("-march=native", TUNE), ("-fopenmp",), ())
#: elements per part below which a call stays on the caller's thread (waking the pool costs more than it saves)
GRAIN = 1 << 15
#: widest rows the kernels take (their stack buffers); wider ones use the torch ops
MAX_NORM_WIDTH, MAX_HEAD_DIM, MAX_HEADS = 4096, 1024, 1024

#: turn the kernels off in this process (``bench/`` times the step with and without them)
ENABLED = True

_lock = threading.Lock()
_state: tuple[ctypes.CDLL | None, str] | None = None

_P, _L, _F, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_float, ctypes.c_int
_SIGNATURES = {
    "rms_norm_fwd": (_P, _P, _P, _P, _L, _L, _F, _I),
    "rms_norm_bwd": (_P, _P, _P, _P, _P, _P, _L, _L, _I),
    "rope_qk_norm_fwd": (_P, _P, _P, _P, _L, _L, _L, _L, _F, _I),
    "rope_qk_norm_bwd": (_P, _P, _P, _P, _P, _P, _P, _P, _L, _L, _L, _L, _I),
    "relu_square_fwd": (_P, _P, _L, _I),
    "relu_square_bwd": (_P, _P, _P, _L, _I),
    "attn_fwd": (_P, _P, _P, _P, _L, _L, _L, _L, _F, _I),
    "attn_bwd": (_P, _P, _P, _P, _P, _P, _P, _L, _L, _L, _L, _F, _I),
}
_RESTYPES = {"attn_workspace": (ctypes.c_long, (_L, _L, _I))}


def _wanted() -> bool:
    choice = os.environ.get(ENV, "").strip().lower()
    if choice not in ("", "on", "off"):
        raise ConfigError(ENV, "expected 'on' (or unset) or 'off'", value=choice, source="environment")
    return choice != "off"


def _variants() -> tuple[tuple[str, ...], ...]:
    """The flag variants to try: ``VARIANTS``, or with ``LOOPSCALE_CPU_MARCH`` set only builds for that
    instruction set (a build for another one would silently not be what was asked for)."""
    march = os.environ.get(MARCH_ENV, "").strip()
    if not march:
        return VARIANTS
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", march):
        raise ConfigError(
            MARCH_ENV,
            "expected a -march value such as 'native', 'x86-64-v3' (AVX2) or 'x86-64-v4' (AVX-512)",
            value=march,
            source="environment",
        )
    return (("-fopenmp", f"-march={march}", TUNE), (f"-march={march}", TUNE))


#: the compiler's macro for an instruction-set extension, and /proc/cpuinfo's flag for it
_EXTENSIONS = {
    "__AVX__": "avx",
    "__AVX2__": "avx2",
    "__FMA__": "fma",
    "__F16C__": "f16c",
    "__AVX512F__": "avx512f",
    "__AVX512DQ__": "avx512dq",
    "__AVX512CD__": "avx512cd",
    "__AVX512BW__": "avx512bw",
    "__AVX512VL__": "avx512vl",
}


def _cpu_flags() -> list[str] | None:
    """/proc/cpuinfo's feature flags (x86 Linux), else None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), None)
    except OSError:
        return None


def _missing_extensions(cc: str, march: str) -> list[str]:
    """The vector extensions a ``-march=`` build would use that this CPU lacks (a build for them would die
    of SIGILL on its first call): the compiler's predefined macros against /proc/cpuinfo's flags."""
    flags = _cpu_flags()
    if flags is None:
        return []  # not an x86 Linux CPU list: nothing to check against
    try:
        done = subprocess.run(
            [cc, f"-march={march}", "-dM", "-E", "-"], input="", capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []  # a -march the compiler refuses: the build then says so
    defined = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("#define ")}
    return [flag for macro, flag in _EXTENSIONS.items() if macro in defined and flag not in flags]


def _compiler() -> str | None:
    """``$CC`` if set (None if it is not there), else ``cc`` or ``gcc`` on the PATH."""
    cc = os.environ.get("CC", "").strip()
    return shutil.which(cc) if cc else (shutil.which("cc") or shutil.which("gcc"))


def _cpu() -> str:
    """This CPU's model and feature flags: ``-march=native`` code must not run on another CPU, so they key
    the cache (a home folder shared by cluster nodes of different CPUs keeps one build per CPU)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            info = [line for line in fh if line.startswith(("model name", "flags", "Features", "CPU part"))]
        return "".join(sorted(set(info)))
    except OSError:
        return platform.processor() + platform.machine()


def _build(cc: str, variants: tuple[tuple[str, ...], ...]) -> tuple[Path, tuple[str, ...]]:
    """The shared library for this source, compiler, flags and CPU, and the variant that compiled: built
    once, renamed into place atomically (sweep workers starting together may all build it; the last rename
    wins, every copy is the same)."""
    code, cpu = SOURCE.read_bytes(), _cpu().encode()
    errors = []
    for extra in variants:
        flags = (*FLAGS, *extra)
        key = hashlib.sha256(
            b"\0".join([code, cc.encode(), " ".join(flags).encode(), cpu, sys.platform.encode()])
        ).hexdigest()[:16]
        target = cache_dir() / "kernels" / f"cpu_kernels-{key}.so"
        if target.is_file():
            return target, extra
        march = os.environ.get(MARCH_ENV, "").strip()  # checked when building: a cached build passed it
        if march and (missing := _missing_extensions(cc, march)):
            raise RuntimeError(f"{MARCH_ENV}={march} needs {', '.join(missing)}, which this CPU lacks")
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".cpu_kernels.", suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            done = subprocess.run(
                [cc, *flags, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True, timeout=120, check=False
            )
            if done.returncode == 0:
                os.replace(tmp, target)
                return target, extra
            errors.append((done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[0])
        finally:
            Path(tmp).unlink(missing_ok=True)
    raise RuntimeError(f"{cc} failed: {errors[-1]}")


def _load() -> tuple[ctypes.CDLL | None, str]:
    if not _wanted():
        return None, f"off ({ENV}=off): torch ops"
    variants = _variants()
    cc = _compiler()
    if cc is None:
        return None, "unavailable (no C compiler: install one, or set CC to one): torch ops"
    try:
        path, extra = _build(cc, variants)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"unavailable ({exc}): torch ops"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:  # a damaged cached build (a crash mid-write): removed, so the next process rebuilds it
        path.unlink(missing_ok=True)
        return None, f"unavailable ({exc}; the cached build was removed): torch ops"
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, None
    for name, (res, args) in _RESTYPES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib, "compiled" + (f" ({' '.join(extra)})" if extra else "")


def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None (then ``fused.py`` uses torch ops); built on the first call."""
    global _state
    if _state is None:
        with _lock:
            if _state is None:
                _state = _load()
    return _state[0]


def status() -> str:
    """'compiled', or why not and what runs instead (recorded in a run's hardware info)."""
    library()
    assert _state is not None
    return _state[1]


def reset() -> None:
    """Forget the loaded state (tests switch ``LOOPSCALE_CPU_KERNELS`` and the compiler)."""
    global _state
    _state = None


def serves(x: torch.Tensor, width: int = 0, limit: int = 0) -> bool:
    """Whether the kernels take ``x``: a plain fp32 CPU tensor with memory behind it (not a fake, meta or
    ``torch.func``-wrapped one: memory estimates and transforms run the torch ops), no dispatch mode active
    (a ``FlopCounterMode`` must see the torch ops), a width the kernels' buffers hold, and a compiled
    library. fp64 keeps the torch ops, which ``gradcheck`` checks."""
    return (
        ENABLED
        and type(x) is torch.Tensor
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and x.layout == torch.strided
        and not torch._C._functorch.is_functorch_wrapped_tensor(x)
        and torch._C._len_torch_dispatch_stack() == 0
        and width <= limit
        and library() is not None
    )


def _parts(numel: int) -> int:
    return max(1, min(torch.get_num_threads(), numel // GRAIN))


def _lib() -> ctypes.CDLL:
    """The compiled library, for the kernel wrappers below: their callers checked ``serves`` (so it loaded)."""
    lib = library()
    assert lib is not None, "cpu kernels called without a compiled library (check serves() first)"
    return lib


def _ptr(t: torch.Tensor) -> int:
    """The address of ``t``'s first element; the caller keeps ``t`` alive (bound to a name) for the call."""
    return t.data_ptr()


def rms_norm_fwd(
    x: torch.Tensor, w: torch.Tensor, eps: float, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x rstd w and rstd [..., 1] for contiguous fp32 ``x`` (into ``out``, two contiguous tensors, if given:
    a pack's members write into their slices of one tensor, ``model/packed.py``)."""
    n = x.size(-1)
    y, rstd = out if out is not None else (torch.empty_like(x), x.new_empty((*x.shape[:-1], 1)))
    rows, w = x.numel() // n, w.contiguous()  # bound: a pointer into a temporary would dangle
    _lib().rms_norm_fwd(_ptr(x), _ptr(w), _ptr(y), _ptr(rstd), rows, n, eps, _parts(x.numel()))
    return y, rstd


def rms_norm_bwd(
    g: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    rstd: torch.Tensor,
    want_dw: bool,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """dL/dx (into ``out``, contiguous, if given) and (if wanted) dL/dw; ``g`` and ``x`` contiguous fp32. Each
    part sums its rows' dL/dw into its own row of a [parts, n] buffer, summed here (the same bits for the same
    thread count)."""
    n = x.size(-1)
    rows, parts = x.numel() // n, _parts(x.numel())
    gx = torch.empty_like(x) if out is None else out
    dw_parts = x.new_zeros(parts, n) if want_dw else None
    w = w.contiguous()
    _lib().rms_norm_bwd(
        _ptr(g), _ptr(x), _ptr(w), _ptr(rstd), _ptr(gx), None if dw_parts is None else _ptr(dw_parts), rows, n, parts
    )
    return gx, (dw_parts.sum(0) if dw_parts is not None else None)


def rope_qk_norm_fwd(qkv: torch.Tensor, turn: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE then QK-norm on q and k of a contiguous fp32 [B, T, 3, H, hd] (pairs adjacent), v copied;
    ``turn`` [T, hd/2] complex64 (cos - i sin). Returns the output and rstd [B, T, 2, H, 1]."""
    B, T, _, H, hd = qkv.shape
    out = torch.empty_like(qkv)
    rstd = qkv.new_empty(B, T, 2, H, 1)
    table = torch.view_as_real(turn.contiguous())
    _lib().rope_qk_norm_fwd(_ptr(qkv), _ptr(table), _ptr(out), _ptr(rstd), B, T, H, hd, eps, _parts(qkv.numel()))
    return out, rstd


def rope_qk_norm_bwd(
    gq: torch.Tensor, gk: torch.Tensor, gv: torch.Tensor, out: torch.Tensor, rstd: torch.Tensor, turn: torch.Tensor
) -> torch.Tensor:
    """The gradient [B, T, 3, H, hd] from those of q, k, v ([B, T, H, hd], any strides: SDPA's backends
    hand them over in different layouts), the saved output and rstd."""
    B, T, _, H, hd = out.shape
    grad = torch.empty_like(out)
    strides = (ctypes.c_long * 12)(*gq.stride(), *gk.stride(), *gv.stride())
    table = torch.view_as_real(turn.contiguous())
    _lib().rope_qk_norm_bwd(
        _ptr(gq),
        _ptr(gk),
        _ptr(gv),
        ctypes.addressof(strides),
        _ptr(out),
        _ptr(rstd),
        _ptr(table),
        _ptr(grad),
        B,
        T,
        H,
        hd,
        _parts(out.numel()),
    )
    return grad


def relu_square_fwd(z: torch.Tensor, sq: torch.Tensor) -> None:
    """``z`` (contiguous fp32) becomes relu(z) in place; ``sq`` (same size) receives its square."""
    _lib().relu_square_fwd(_ptr(z), _ptr(sq), z.numel(), _parts(z.numel()))


def relu_square_bwd(h: torch.Tensor, g: torch.Tensor, sq: torch.Tensor) -> None:
    """``g`` (the gradient at h^2) becomes 2 g h in place; ``sq`` receives h^2. All contiguous fp32."""
    _lib().relu_square_bwd(_ptr(h), _ptr(g), _ptr(sq), h.numel(), _parts(h.numel()))


def attention_serves(qkv: torch.Tensor) -> bool:
    """Whether ``attention_fwd`` takes ``qkv`` [B, T, 3, H, hd]: the kernels serve it, hd is a multiple of 16
    (the register tiles' width), and SDPA's flash backend is allowed: under ``sdpa_kernel(MATH)`` (as the FLOP
    counter test uses) and other backend choices the caller's SDPA runs, as asked."""
    return qkv.dim() == 5 and qkv.size(-1) % 16 == 0 and torch.backends.cuda.flash_sdp_enabled() and serves(qkv)


def _attn_parts(B: int, H: int, T: int, hd: int) -> int:
    return max(1, min(torch.get_num_threads(), B * H, B * H * T * T * hd // GRAIN))


def attention_fwd(qkv: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal softmax(q k^T scale) v per head from contiguous fp32 ``qkv`` [B, T, 3, H, hd] (the output of
    ``rope_qk_norm_fwd``). Returns out [B, T, H, hd] (the out projection's layout) and the log-sum-exp of
    each query row [B, H, T] for the backward pass."""
    B, T, _, H, hd = qkv.shape
    out = qkv.new_empty(B, T, H, hd)
    lse = qkv.new_empty(B, H, T)
    parts = _attn_parts(B, H, T, hd)
    work = qkv.new_empty(parts, _lib().attn_workspace(T, hd, 0))
    _lib().attn_fwd(_ptr(qkv), _ptr(out), _ptr(lse), _ptr(work), B, T, H, hd, scale, parts)
    return out, lse


def attention_bwd(
    qkv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, g: torch.Tensor, scale: float
) -> torch.Tensor:
    """The gradient [B, T, 3, H, hd] of q, k and v from the saved ``qkv``, ``out``, ``lse`` and ``g`` (out's
    gradient as [B, T, H, hd], any strides)."""
    B, T, _, H, hd = qkv.shape
    grad = torch.empty_like(qkv)
    strides = (ctypes.c_long * 4)(*g.stride())
    parts = _attn_parts(B, H, T, hd)
    work = qkv.new_empty(parts, _lib().attn_workspace(T, hd, 1))
    _lib().attn_bwd(
        _ptr(qkv),
        _ptr(out),
        _ptr(lse),
        _ptr(g),
        ctypes.addressof(strides),
        _ptr(grad),
        _ptr(work),
        B,
        T,
        H,
        hd,
        scale,
        parts,
    )
    return grad
