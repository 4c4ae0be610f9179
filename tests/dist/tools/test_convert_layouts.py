"""HF -> megatron at every layout (torchrun, gloo): `tools.convert_checkpoint hf-to-mcore` then `verify` (fp32
logits against transformers within 1e-4), each checkpoint also verified after resharding from the 1x1 one, and
`mcore-to-hf` back to the input HF tensors bitwise.

- Dense families (qwen2, mistral, tied llama) at TP2, PP2 (2 ranks) and TP2xPP2 (4 ranks).
- Qwen3-MoE at EP2, TP2, PP2 (2 ranks) and TP2xEP2, PP2xEP2 (4 ranks); Mixtral at EP2, TP2 and PP2.

The module fixture converts everything in two launches of the shared worker (2 ranks, then 4), each running the
convert_layouts case once per work directory; the tests read the `verify` lines and convert back in this process (the
converter's CLI is tested in tests/e2e/tools/).
"""
import pytest

from tests.launch import worker
from tests.support.tiny_hf import DIST_CASES, diff_state_dicts, load_tensors, parse_verify_lines
from tests.support.tiny_moe import tiny_mixtral, tiny_moe
from tools.convert_checkpoint import run

pytestmark = pytest.mark.dist
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
DENSE = {2: ("2x1", "1x2"), 4: ("2x2",)}
# work dir -> (ranks, layouts, cases)
MOE = {"moe2": (2, "1x1,1x1x2,2x1,1x2", "qwen3_moe,mixtral"), "moe4": (4, "1x1,2x1x2,1x2x2", "qwen3_moe")}


@pytest.fixture(scope="module")
def converted(tiny_work, tmp_path_factory) -> dict:
    """{"work": {name: dir}, "rows": {ranks: the verify rows of that launch}}."""
    root = tmp_path_factory.mktemp("moe_convert")
    works = {"dense": tiny_work, "moe2": root / "moe2", "moe4": root / "moe4"}
    tiny_moe(False).save_pretrained(str(works["moe2"] / "hf" / "qwen3_moe"))
    tiny_mixtral().save_pretrained(str(works["moe2"] / "hf" / "mixtral"))
    tiny_moe(True).save_pretrained(str(works["moe4"] / "hf" / "qwen3_moe"))
    rows = {}
    for nproc in (2, 4):
        runs = [("convert_layouts", "--work", tiny_work, "--layouts", ",".join(DENSE[nproc]), "--cases",
                 ",".join(DIST_CASES))]
        runs += [("convert_layouts", "--work", works[name], "--layouts", layouts, "--cases", cases)
                 for name, (n, layouts, cases) in MOE.items() if n == nproc]
        proc = worker(nproc, *runs, extra_env=ONE_THREAD)
        rows[nproc] = parse_verify_lines(proc.stdout)
        for row in rows[nproc]:
            print(" ".join(f"{k}={v}" for k, v in row.items()))
    return {"work": works, "rows": rows}


def rows_of(converted, nproc: int, case: str) -> list[dict]:
    return [r for r in converted["rows"][nproc] if r["ckpt"].startswith(f"{case}_")]


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
