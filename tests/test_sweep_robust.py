"""Sweep edges: leftovers of finished runs, the stale-lock race, orphaned workers, corrupt files, failure history."""


import pytest

from loopscale.sweep import prepare, run_sweep, spec_from_dict
from test_sweep_run import tiny_spec


def one_run_spec(**sweep) -> dict:
    return tiny_spec(budgets=[2e9], r=[2], widths={"2e9": [16]}, **sweep)


@pytest.fixture(scope="module")
def one_done(tmp_path_factory: pytest.TempPathFactory):
    """A finished one-run sweep: (spec, store, run_id)."""
    spec = spec_from_dict(one_run_spec(), source="one.toml")
    store = prepare(spec, tmp_path_factory.mktemp("sweep") / "sw")
    assert run_sweep(spec, store, progress=False).count("done") == 1
    return spec, store, spec.runs()[0].run_id


def test_rerunning_a_sweep_removes_a_finished_runs_checkpoint_and_temporaries(one_done) -> None:
    spec, store, rid = one_done
    d = store.run_dir(rid)
    (d / "ckpt.pt").write_bytes(b"left by a kill after result.json")
    (d / ".ckpt.pt.k1ll3d_x.tmp").write_bytes(b"left by a kill mid-write")
    (d / ".attempts.json.abcd1234.tmp").write_bytes(b"not the trainer's")
    summary = run_sweep(spec, store, progress=False)
    assert summary.outcomes == {"skipped": [rid]}
    assert not (d / "ckpt.pt").exists() and not (d / ".ckpt.pt.k1ll3d_x.tmp").exists()
    assert (d / ".attempts.json.abcd1234.tmp").exists() and (d / "model.safetensors").exists()
    (d / ".attempts.json.abcd1234.tmp").unlink()
