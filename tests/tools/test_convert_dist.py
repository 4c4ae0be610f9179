"""HF -> megatron at TP2, PP2 and TP2xPP2 (torchrun, gloo): `verify` passes for every family, checkpoints
saved at TP1 load at every layout, and every checkpoint converts back to the HF tensors bitwise.

Two launches in all (2 ranks: 2x1 and 1x2; 4 ranks: 2x2); tests/tools/convert_worker.py does the work.
"""
import os
import subprocess
import sys

import pytest

from tests.tools.tiny_hf import DIST_CASES, ROOT, diff_state_dicts, load_tensors, parse_verify_lines
from tools.convert_checkpoint import run

LAUNCHES = {"tp2_and_pp2": (2, ("2x1", "1x2")), "tp2xpp2": (4, ("2x2",))}


@pytest.mark.dist
@pytest.mark.parametrize("launch", sorted(LAUNCHES))
def test_layouts_verify_and_round_trip(launch, tiny_work):
    nproc, layouts = LAUNCHES[launch]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--standalone", "-m", "tests.tools.convert_worker",
           "--work", str(tiny_work), "--layouts", ",".join(layouts), "--cases", ",".join(DIST_CASES)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    rows = parse_verify_lines(proc.stdout)
    for row in rows:
        print(" ".join(f"{k}={v}" for k, v in row.items()))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    # per layout and case: its own checkpoint, and the TP1 one resharded
    assert len(rows) == 2 * len(layouts) * len(DIST_CASES) and all(r["passed"] for r in rows)
    for layout in layouts:
        for case in DIST_CASES:
            out = tiny_work / "export" / f"{case}_{layout}"
            run(["mcore-to-hf", "--mcore-dir", str(tiny_work / "mcore" / f"{case}_{layout}"), "--out", str(out),
                 "--overwrite"])
            problems = diff_state_dicts(load_tensors(tiny_work / "hf" / case), load_tensors(out))
            assert not problems, f"{case} saved at {layout}: {problems}"
