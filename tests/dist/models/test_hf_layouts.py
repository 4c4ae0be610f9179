"""HF models at every layout (torchrun, gloo).

- Conversion: `tools.convert_checkpoint hf-to-mcore` then `verify` (fp32 logits against transformers within
  1e-4), each checkpoint also verified after resharding from the 1x1 one, and `mcore-to-hf` back to the input HF
  tensors bitwise. Dense families (qwen2, mistral, tied llama) at TP2, PP2 (2 ranks) and TP2xPP2 (4 ranks);
  Qwen3 dense at TP2 and PP2 (with and without a sliding window); Qwen3-MoE at EP2, TP2, PP2 (2 ranks) and TP2xEP2, PP2xEP2 (4 ranks); Mixtral at
  EP2, TP2 and PP2.
- Direct loading (`model.hf_path` alone, models/hf_load.py) equals the converter then a megatron load, bitwise,
  at TP2 and PP2 (dense, a reward model included) and EP2 and TP2 (Qwen3-MoE, Mixtral).
- Qwen3-MoE loaded straight at EP2 (four experts per rank, different tokens per rank: the dispatcher exchanges
  them) gives transformers' logits.
- Qwen2.5-VL and Qwen3-VL loaded straight at TP2 (the vision tower whole on each rank) give transformers' logits
  with images; the trainer's log-prob pass gives transformers' log-probs at TP2 and PP2. Qwen3-VL-MoE (tp = 1):
  the trainer's log-probs at PP2, and logits and log-probs at EP2.

The module fixture runs every case in two launches of the shared worker (2 ranks, then 4); the tests read what
the cases printed, and convert back in this process (the converter's CLI is tested in tests/e2e/tools/).
"""
import re

import pytest

from tests.conftest import HF_LOAD_CASES
from tests.launch import worker
from tests.support.tiny_hf import DIST_CASES, diff_state_dicts, load_tensors, parse_verify_lines, save_tiny
from tests.support.tiny_moe import tiny_mixtral, tiny_moe
from tests.support.tiny_vl import save_tiny_family
from tools.convert_checkpoint import run

pytestmark = pytest.mark.dist
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
DENSE = {2: ("2x1", "1x2"), 4: ("2x2",)}
# work dir -> (ranks, layouts, cases) of convert_layouts
VL_FAMILIES = ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")  # tests/support/tiny_vl.py FAMILIES
# (tp, pp, ep) of each family's vl_logits runs: an MoE VLM trains at tp = 1 (qwen3_vl_moe.run_errors)
VL_LAYOUTS = {"qwen2_5_vl": ((2, 1, 1), (1, 2, 1)), "qwen3_vl": ((2, 1, 1), (1, 2, 1)),
              "qwen3_vl_moe": ((1, 2, 1), (1, 1, 2))}
CONVERT = {"moe2": (2, "1x1,1x1x2,2x1,1x2", "qwen3_moe,mixtral"), "moe4": (4, "1x1,2x1x2,1x2x2", "qwen3_moe"),
           "qwen3": (2, "2x1,1x2", "qwen3,qwen3_window")}


@pytest.fixture(scope="module")
def converted(tiny_work, hf_load_work, hf_load_moe_work, tmp_path_factory) -> dict:
    """{"work": {name: dir}, "rows": {ranks: the verify rows of that launch}, "out": {ranks: its stdout}}."""
    root = tmp_path_factory.mktemp("hf_layouts")
    works = {"dense": tiny_work, "moe2": root / "moe2", "moe4": root / "moe4", "qwen3": root / "qwen3",
             "ep_logits": root / "ep_logits", **{family: root / family for family in VL_FAMILIES}}
    tiny_moe(False).save_pretrained(str(works["moe2"] / "hf" / "qwen3_moe"))
    tiny_mixtral().save_pretrained(str(works["moe2"] / "hf" / "mixtral"))
    tiny_moe(True).save_pretrained(str(works["moe4"] / "hf" / "qwen3_moe"))
    save_tiny(works["qwen3"] / "hf" / "qwen3", "qwen3")
    save_tiny(works["qwen3"] / "hf" / "qwen3_window", "qwen3_window")
    tiny_moe(False).save_pretrained(str(works["ep_logits"]))
    for family in VL_FAMILIES:
        save_tiny_family(family, works[family])
    rows, out = {}, {}
    for nproc in (2, 4):
        runs = [("convert_layouts", "--work", tiny_work, "--layouts", ",".join(DENSE[nproc]), "--cases",
                 ",".join(DIST_CASES))]
        runs += [("convert_layouts", "--work", works[name], "--layouts", layouts, "--cases", cases)
                 for name, (n, layouts, cases) in CONVERT.items() if n == nproc]
        if nproc == 2:
            runs += [("moe_logits", "--hf-dir", works["ep_logits"], "--ep", 2),
                     *[("vl_logits", "--hf-dir", works[family], "--tp", tp, "--pp", pp, "--ep", ep)
                       for family, layouts in VL_LAYOUTS.items() for tp, pp, ep in layouts],
                     ("hf_load", "--work", hf_load_work, "--layouts", "1x1,2x1,1x2", "--cases", ",".join(HF_LOAD_CASES)),
                     ("hf_load", "--work", hf_load_moe_work, "--layouts", "1x1,1x1x2,2x1", "--cases",
                      "qwen3_moe,mixtral")]
        proc = worker(nproc, *runs, extra_env=ONE_THREAD)
        rows[nproc], out[nproc] = parse_verify_lines(proc.stdout), proc.stdout
        for row in rows[nproc]:
            print(" ".join(f"{k}={v}" for k, v in row.items()))
    return {"work": works, "rows": rows, "out": out}


def rows_of(converted, nproc: int, case: str) -> list[dict]:
    return [r for r in converted["rows"][nproc] if re.fullmatch(rf"{case}_\d+x\d+(x\d+)?", r["ckpt"])]


def hf_load_lines(converted, cases: tuple[str, ...]) -> list[str]:
    lines = [line for line in converted["out"][2].splitlines() if line.startswith("hf_load ")
             and line.split()[1].removeprefix("case=") in cases]
    print("\n".join(lines))
    return lines


def layouts_of(rows: list[dict], case: str = "qwen3_moe") -> list[tuple[str, str, str, str]]:
    return [(r["ckpt"].removeprefix(f"{case}_"), r["tp"], r["pp"], r["ep"]) for r in rows]


def round_trip(work, layout: str, case: str = "qwen3_moe") -> list[str]:
    """mcore-to-hf in this process (one rank: megatron reshards the EP checkpoint to 1x1) against the source HF
    tensors."""
    out = work / f"back_{case}_{layout}"
    assert run(["mcore-to-hf", "--mcore-dir", str(work / "mcore" / f"{case}_{layout}"), "--out", str(out)]) == 0
    return diff_state_dicts(load_tensors(work / "hf" / case), load_tensors(out))


@pytest.mark.parametrize("nproc", sorted(DENSE), ids=lambda n: {2: "tp2_and_pp2", 4: "tp2xpp2"}[n])
def test_layouts_verify_and_round_trip(nproc, converted):
    """Dense families: per layout and case, its own checkpoint and the TP1 one resharded pass `verify`; every
    checkpoint converts back to the HF tensors bitwise."""
    layouts, work = DENSE[nproc], converted["work"]["dense"]
    rows = [r for case in DIST_CASES for r in rows_of(converted, nproc, case)]
    assert len(rows) == 2 * len(layouts) * len(DIST_CASES) and all(r["passed"] for r in rows)
    for layout in layouts:
        for case in DIST_CASES:
            out = work / "export" / f"{case}_{layout}"
            run(["mcore-to-hf", "--mcore-dir", str(work / "mcore" / f"{case}_{layout}"), "--out", str(out),
                 "--overwrite"])
            problems = diff_state_dicts(load_tensors(work / "hf" / case), load_tensors(out))
            assert not problems, f"{case} saved at {layout}: {problems}"


def test_moe_logits_at_ep2_tp2_pp2_and_ep2_round_trip_bitwise(converted):
    rows = rows_of(converted, 2, "qwen3_moe")
    assert layouts_of(rows) == [("1x1", "1", "1", "1"), ("1x1x2", "1", "1", "2"), ("1x1", "1", "1", "2"),
                                ("2x1", "2", "1", "1"), ("1x1", "2", "1", "1"), ("1x2", "1", "2", "1"),
                                ("1x1", "1", "2", "1")]
    assert all(r["passed"] and float(r["logits_max"]) <= 1e-4 for r in rows)
    assert round_trip(converted["work"]["moe2"], "1x1x2") == []


def test_moe_logits_at_tp2xep2_and_pp2xep2_and_round_trip_bitwise(converted):
    """Four ranks. TP2xEP2 (experts whole, parallel.etp=1): the EP group is the TP pair, which therefore holds
    four different experts each and the same attention shards."""
    rows = rows_of(converted, 4, "qwen3_moe")
    assert layouts_of(rows) == [("1x1", "1", "1", "1"), ("2x1x2", "2", "1", "2"), ("1x1", "2", "1", "2"),
                                ("1x2x2", "1", "2", "2"), ("1x1", "1", "2", "2")]
    assert all(r["passed"] and float(r["logits_max"]) <= 1e-4 for r in rows)
    assert round_trip(converted["work"]["moe4"], "2x1x2") == []


def test_mixtral_logits_at_ep2_and_round_trip_bitwise(converted):
    """Mixtral (block_sparse_moe w1/w3/w2): `hf-to-mcore` at EP2, TP2 and PP2, each verified (and the 1x1
    checkpoint resharded to it) against transformers; the EP2 checkpoint back to HF bitwise."""
    rows = rows_of(converted, 2, "mixtral")
    assert layouts_of(rows, "mixtral") == [("1x1", "1", "1", "1"), ("1x1x2", "1", "1", "2"), ("1x1", "1", "1", "2"),
                                           ("2x1", "2", "1", "1"), ("1x1", "2", "1", "1"), ("1x2", "1", "2", "1"),
                                           ("1x1", "1", "2", "1")]
    assert all(r["passed"] and float(r["logits_max"]) <= 1e-4 for r in rows)
    assert round_trip(converted["work"]["moe2"], "1x1x2", "mixtral") == []


def test_qwen3_logits_match_transformers_at_tp2_and_pp2(converted):
    """tools.convert_checkpoint hf-to-mcore + verify (transformers fp32 against ours) at 2x1 and 1x2."""
    rows = rows_of(converted, 2, "qwen3")
    assert len(rows) == 2 and all(r["passed"] and float(r["logits_max"]) <= 1e-4 for r in rows)


def test_sliding_window_logits_match_transformers_at_tp2_and_pp2(converted):
    """Qwen3 with a window of 8 on layers 2-3 (`use_sliding_window`, max_window_layers 2): verify's 32 tokens."""
    rows = rows_of(converted, 2, "qwen3_window")
    assert len(rows) == 2 and all(r["passed"] and float(r["logits_max"]) <= 1e-4 for r in rows)


def test_moe_logits_match_transformers_at_ep2(converted):
    """Two ranks, parallel.ep=2: four experts per rank, different tokens per rank (the dispatcher exchanges them)."""
    rows = re.findall(r"moe ep=2 rank=(\d) local_experts=(\d+) logits_max=(\d\.\d+e[-+]\d+)", converted["out"][2])
    print(rows)  # the two ranks' lines may interleave
    assert sorted(r[0] for r in rows) == ["0", "1"] and all(r[1] == "4" and float(r[2]) <= 1e-4 for r in rows)


def test_direct_load_equals_converter_then_load_at_tp2_and_pp2(converted):
    lines = hf_load_lines(converted, HF_LOAD_CASES)
    assert len(lines) == 3 * len(HF_LOAD_CASES) and all("mismatched=0" in line for line in lines)


def test_moe_direct_load_equals_converter_then_load_at_ep2_and_tp2(converted):
    lines = hf_load_lines(converted, ("qwen3_moe", "mixtral"))
    assert len(lines) == 6 and all("mismatched=0" in line for line in lines)


@pytest.mark.parametrize("family", ("qwen2_5_vl", "qwen3_vl"))
def test_vision_lm_logits_match_transformers_with_images_at_tp2(converted, family):
    rows = re.findall(rf"vl {family} tp=2 rank=(\d) logits_max=(\d\.\d+e[-+]\d+)", converted["out"][2])
    print(rows)
    assert sorted(r[0] for r in rows) == ["0", "1"] and all(float(r[1]) <= 1e-5 for r in rows)


@pytest.mark.parametrize("family, layout", [(f, f"tp={tp} pp={pp}") for f, layouts in VL_LAYOUTS.items()
                                            for tp, pp, ep in layouts if ep == 1])
def test_vision_lm_trainer_log_probs_match_transformers_with_images_at_tp2_and_pp2(converted, layout, family):
    """The old-log-prob pass (tower, image scatter, M-RoPE, Qwen3-VL's DeepStack; padded and packed) at TP2, and at
    PP2: the tower, the image rows and the DeepStack layers on the first stage, the M-RoPE positions on both
    (tests/cases/vl_logits.py)."""
    rows = re.findall(rf"vl {family} train {layout} rank=(\d) logp_max=(\d\.\d+e[-+]\d+)", converted["out"][2])
    print(rows)
    assert sorted(r[0] for r in rows) == ["0", "1"] and all(float(r[1]) <= 1e-5 for r in rows)


def test_qwen3_vl_moe_logits_and_trainer_log_probs_match_transformers_at_ep2(converted):
    """Qwen3-VL-MoE at EP2 (two of the four experts a rank; each rank's tokens reach the other's experts through the
    dispatcher), the tower whole on both ranks: logits and the old-log-prob pass equal transformers'."""
    out = converted["out"][2]
    rows = re.findall(r"vl qwen3_vl_moe (?:train )?tp=1 (?:pp=1 )?ep=2 rank=(\d) \w+=(\d\.\d+e[-+]\d+)", out)
    print(rows)
    assert sorted(r[0] for r in rows) == ["0", "0", "1", "1"] and all(float(r[1]) <= 1e-5 for r in rows)
