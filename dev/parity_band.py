"""Print the 8-step paper-parity numbers on this machine (developer tool, not installed; docs/testing.md).

For each fixture case: loopscale's gap to the paper code's losses, loopscale's own noise here (the largest
move under the loss rescalings of ``tests/test_parity.py``), the band the test uses, and each recipe
deviation's gap as a multiple of the band. Run it under the settings to compare, e.g.::

    python dev/parity_band.py
    LOOPSCALE_CPU_MARCH=x86-64-v3 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python dev/parity_band.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
torch.set_num_threads(1)  # as the tests run

import test_parity as tp  # noqa: E402
from loopscale.model import cpu_kernels  # noqa: E402


def main() -> None:
    print(f"kernels: {cpu_kernels.status()}; ATen: {torch.backends.cpu.get_cpu_capability()}")
    names = sorted(tp.DEVIATIONS)
    print(f"{'case':9s} {'gap':>9s} {'own':>9s} {'paper':>9s} {'band':>9s}  " + "  ".join(names))
    for name in sorted(tp.CASES):
        band = tp._tolerance(name)
        gap = tp._loss_gap(name, tp._first_steps(name, tp.PARITY_OPTIM)[0])
        devs = [tp._loss_gap(name, tp._first_steps(name, *tp.DEVIATIONS[d])[0]) / band for d in names]
        print(
            f"{name:9s} {gap:9.2e} {tp._own_noise(name):9.2e} {tp.CASES[name]['self_noise']:9.2e} {band:9.2e}  "
            + "  ".join(f"{x:{len(d)}.1f}x" for x, d in zip(devs, names, strict=True))
        )


if __name__ == "__main__":
    main()
