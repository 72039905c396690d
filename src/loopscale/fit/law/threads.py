"""Run the fit with single-threaded BLAS.

The fit's linear algebra is tiny (6 x 6 systems, L-BFGS-B on 6 variables). OpenBLAS nevertheless
starts its thread pool for it, and on a busy machine (2 cores, a training run next door) its
threads spin-wait: scipy's L-BFGS-B then runs 10-20x slower (measured: 0.08 s vs 0.004 s per
6-variable fit). Pinning BLAS to one thread for the duration of a fit removes that. threadpoolctl
is used when installed; otherwise the setter exported by each loaded OpenBLAS is called through
ctypes. Either way the previous thread counts are restored afterwards, and anything missing is a
no-op (the fit is then only slower).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_SETTERS = (
    "openblas_set_num_threads",
    "scipy_openblas_set_num_threads",
    "scipy_openblas_set_num_threads64_",
    "openblas_set_num_threads64_",
)
_GETTERS = (
    "openblas_get_num_threads",
    "scipy_openblas_get_num_threads",
    "scipy_openblas_get_num_threads64_",
    "openblas_get_num_threads64_",
)


def _openblas_libs() -> list[tuple[ctypes.CDLL, str, str]]:
    if not sys.platform.startswith("linux"):
        return []
    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            paths = {line.split()[-1] for line in fh if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return []
    out = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        for setter, getter in zip(_SETTERS, _GETTERS, strict=True):
            if hasattr(lib, setter) and hasattr(lib, getter):
                out.append((lib, setter, getter))
                break
    return out


_depth = [0]  # nesting depth: only the outermost block pays for finding the BLAS libraries (~20 ms)


@contextmanager
def single_thread_blas() -> Iterator[None]:
    """Limit BLAS to one thread inside the block (restored on exit); nested blocks cost nothing."""
    if _depth[0]:
        yield
        return
    _depth[0] += 1
    try:
        with _limit():
            yield
    finally:
        _depth[0] -= 1


@contextmanager
def _limit() -> Iterator[None]:
    import scipy.optimize  # noqa: F401  (loads scipy's own OpenBLAS, so it is limited too)

    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    if threadpool_limits is not None:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
        return
    libs = _openblas_libs()
    previous = []
    for lib, setter, getter in libs:
        try:
            previous.append((lib, setter, int(getattr(lib, getter)())))
            getattr(lib, setter)(1)
        except Exception:  # a foreign symbol with another signature: leave it alone
            continue
    try:
        yield
    finally:
        for lib, setter, n in previous:
            getattr(lib, setter)(n)
