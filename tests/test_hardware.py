"""Hardware: peak FLOP/s by the device name torch reports; torch threads of a local sweep slot."""

import pytest
import torch

from loopscale.train.hardware import SLOT_CORES_ENV, Dist, peak_bf16, setup_threads


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989),  # SXM5
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H100 NVL", 835),
        ("NVIDIA H200", 989),
        ("NVIDIA H200 NVL", 835),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA A100 80GB PCIe", 312),
        ("NVIDIA L40S", 362),
        ("NVIDIA L40", 181),
        ("NVIDIA L4", 121),
        ("NVIDIA GeForce RTX 4090", 165),
        ("NVIDIA GeForce GTX 1080", None),
    ],
)
def test_peak_flops_match_the_device_name_torch_reports_most_specific_first(name: str, tflops: int | None) -> None:
    peak = peak_bf16(name)
    assert (None if peak is None else round(peak / 1e12)) == tflops


@pytest.fixture
def restore_threads():
    old = torch.get_num_threads()
    yield
    torch.set_num_threads(old)


def test_a_slot_worker_takes_its_share_of_the_cores_unless_run_threads_is_set(
    monkeypatch: pytest.MonkeyPatch, restore_threads: None
) -> None:
    from loopscale.sweep.local import slot_threads

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv(SLOT_CORES_ENV, raising=False)
    assert setup_threads(None, Dist()) == 16  # no slot: every core
    env = slot_threads(2, 1)
    assert env == {SLOT_CORES_ENV: "8", "OMP_NUM_THREADS": "8"}
    assert slot_threads(2, 2) == {SLOT_CORES_ENV: "8", "OMP_NUM_THREADS": "4"}  # torchrun: per rank
    assert slot_threads(32, 1) == {SLOT_CORES_ENV: "1", "OMP_NUM_THREADS": "1"}  # at least one
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert setup_threads(None, Dist()) == 8 and torch.get_num_threads() == 8
    assert setup_threads(3, Dist()) == 3  # run.threads wins
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert setup_threads(None, Dist(world=2)) == 4
