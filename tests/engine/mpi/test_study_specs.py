"""The NERSC generation x NVLink study, run end to end from its shipped spec under a real
mpiexec: its sweep.h5 holds the published top-10 of every (system, NVLink, strategy, GPU
count) of tests/data/nersc2024_reference_top10.json."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from tests.conftest import DATA, REPO
from tests.engine.mpi.conftest import mpiexec

pytestmark = pytest.mark.mpi

REFERENCE = json.loads((DATA / "nersc2024_reference_top10.json").read_text())["files"]


@pytest.mark.parametrize("model", ["gpt3_1T", "vit_era5"])
def test_study_spec_reproduces_published_top10(model, tmp_path):
    out = tmp_path / model
    proc = mpiexec(2, "run", str(REPO / "specs" / f"nersc-generations-{model}.yaml"),
                   "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    with h5py.File(out / "sweep.h5", "r") as f:
        assert f.attrs["complete"]
        cases, top = f["cases"][:], f["top"][:]
    index = {(c["hardware"].decode(), c["strategy"].decode(), int(c["n_gpus"])): int(c["case_id"])
             for c in cases}
    checked = 0
    for ref in (r for r in REFERENCE if r["model"] == model):
        label = f"nersc-{ref['system']}[nvlink_domain={ref['nvlink_size']}]"
        for n in [2**k for k in range(2, 15)]:
            cid = index[(label, ref["strategy"], n)]
            rows = top[top["case_id"] == cid]
            entry = ref["by_n_gpus"].get(str(n))
            if entry is None:  # dropped by the study: nothing fits
                assert len(rows) == 0 and n < int(ref["n_gpus"][0])
                continue
            np.testing.assert_allclose(rows["samples_per_s"], entry["top10_throughputs"],
                                       rtol=1e-9, atol=0)
            for i, r in enumerate(entry["top"]):
                cfg = r["config"]
                assert int(rows["dp"][i]) == cfg["dp"] and int(rows["pp"][i]) == cfg["pp"]
                assert int(rows["mbs"][i]) == cfg["mbs"]
                second = rows["tp2"][i] if ref["strategy"] == "2d" else rows["cp"][i]
                assert int(rows["tp"][i] * second) == cfg["tp"]
            checked += 1
    assert checked == sum(len(r["by_n_gpus"]) for r in REFERENCE if r["model"] == model)
