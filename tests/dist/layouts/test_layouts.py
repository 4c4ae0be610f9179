"""The core promise: the same loss, grad norm and per-token log-probs / values (before and after optimizer steps)
at every TP/PP/DP(/EP) layout, checked by the shipped tool (tools/check_layouts.py) with gloo.

Every check is a row of RUNS; the module fixture runs the rows of each world size in ONE launch of the shared
worker (the check_layouts case: the tool's main), and each test reads its row's exit code and table. The tool's
own command line (`python -m tools.check_layouts`, one plain process) runs in the test of layouts a model cannot
take: one line each, exit 2, before any model is built.

- Dense: TP/PP/DP at 2 and 4 ranks, sequence parallelism, packing (budgets, automatic, SP), a zero tolerance fails.
- Expert parallelism: the tiny MoE preset (a random 4-layer Qwen3-MoE, 8 experts top-2, drawn per global expert
  index so every layout builds the same model) at EP2, EP4, TP2xEP2 (sequence parallel) and PP2xEP2.
- LoRA (rank 8 actor, rank 4 critic, on every linear): TP2, PP2 and TP2xPP2 after three steps, so A (whose first
  gradient is zero while B is zero) is compared too; with packing; on the MoE model at EP2 and TP2, with the
  sequential and the grouped experts.
- A vision LM (the tiny Qwen2.5-VL preset, an image in every row) at DP2, TP2 and PP2, padded and packed; the tiny
  Qwen3-VL at DP2 and TP2, and Qwen3-VL-MoE at DP2 and EP2.
- Full MoE fine-tuning at TP2 + SP after three steps. At EP 1 megatron 0.16.1 marks expert weights
  `allreduce=True`, so DDP reduced their gradients over the data-parallel group only; each TP rank trained its
  copy of the experts on its own sequence shard and the actor's log-probs were 0.38 off after three steps (0.72 at
  the preset's lr). `moe_compat.reduce_experts_over_expert_dp` (M3) reduces them over the expert-data-parallel
  group, which spans TP.
"""
import re

import pytest

from tests.launch import outputs, worker
from tests.support.layouts import check_layouts, parse_table
from tests.support.paths import CONFIGS

pytestmark = pytest.mark.dist
MOE = "tiny_moe_grpo.yaml"
LORA = ("model.lora_rank=8", "model.lora_alpha=16", "critic.lora_rank=4", "actor.optim.lr=1e-2")
# label -> (ranks, config, layouts, tool arguments)
RUNS = {
    "four_ranks": (4, "tiny_grpo.yaml", "1x1,2x1,1x2,2x2", ()),
    "packed_tp2pp2": (4, "tiny_grpo.yaml", "1x1,2x2", ("--packing", "both", "--max-tokens", "40")),
    # 2x1x4: an expert group wider than DP (its 4 ranks span TP2 x DP2), as slime's TP4 x EP8 on 8 GPUs
    "ep": (4, MOE, "1x1,1x1x2,1x1x4,2x1x2,2x1x4,1x2x2", ()),
    "lora": (4, "tiny_grpo.yaml", "1x1,2x1,1x2,2x2", ("--steps", "3", *LORA)),
    "sp_entropy": (2, "tiny_grpo.yaml", "1x1,2x1,1x2", ("--sequence-parallel", "actor.use_kl_loss=false",
                                                         "actor.entropy_coeff=0.01",
                                                         "actor.loss_agg_mode=seq-mean-token-mean",
                                                         "actor.policy_loss=gspo")),
    "tolerance_zero": (2, "tiny_grpo.yaml", "1x1,2x1", ("--tolerance", "0")),
    "packed_sp": (2, "tiny_grpo.yaml", "1x1,2x1", ("--packing", "on", "--sequence-parallel", "--max-tokens", "45",
                                                   "actor.loss_agg_mode=seq-mean-token-mean", "actor.policy_loss=gspo",
                                                   "actor.entropy_coeff=0.01")),
    "packed_auto": (2, "tiny_grpo.yaml", "1x1,1x2", ("--packing", "both")),
    "vlm": (2, "tiny_vlm_grpo.yaml", "1x1,2x1,1x2", ("--packing", "both")),
    # Qwen3-VL (DeepStack): pp=2 would put a DeepStack layer of its 2-layer LM off the first stage (refused); lr 1e-3
    # as for the MoE below: at the preset's 1e-2 Adam turns fp32 noise into ~3e-4 log-prob differences after a step
    "vlm3": (2, "tiny_vlm3_grpo.yaml", "1x1,2x1", ("--packing", "both", "actor.optim.lr=1e-3")),
    # Qwen3-VL-MoE: DP2 and EP2 (tp > 1 would need sequence parallelism; DeepStack fills all 3 LM layers: pp = 1)
    "vlm3_moe": (2, "tiny_vlm3_moe_grpo.yaml", "1x1,1x1x2", ("--packing", "both", "actor.optim.lr=1e-3")),
    "lora_packed": (2, "tiny_grpo.yaml", "1x1,2x1", ("--packing", "both", "--steps", "2", "--sequence-parallel",
                                                     "--max-tokens", "45", *LORA)),
    "lora_moe": (2, MOE, "1x1,1x1x2,2x1", ("--steps", "3", *LORA, "critic.optim.lr=1e-2")),
    # ... through the grouped experts (the GPU default), their adapters as low-rank grouped GEMMs
    "lora_moe_grouped": (2, MOE, "1x1,1x1x2,2x1", ("--steps", "3", *LORA, "critic.optim.lr=1e-2",
                                                   "model.moe_expert_impl=grouped-reference")),
    # actor lr 1e-3 (the preset's 1e-2 also passes): Adam's first steps scale each gradient element by
    # 1/(|g| + eps), so elements with |g| ~ eps turn fp32 summation-order noise into ~1e-5 log-prob differences
    "moe_tp2_sp": (2, MOE, "1x1,2x1,2x1x2", ("--steps", "3", "actor.optim.lr=1e-3")),  # 2x1x2: EP over TP, dp 1
}


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    """{label: {"rc": the tool's exit code, "out": the table it printed}}: one launch per world size."""
    found = {}
    for nproc in (2, 4):
        labels = [label for label, (n, *_) in RUNS.items() if n == nproc]
        proc = worker(nproc, *[("check_layouts", "--config", CONFIGS / RUNS[label][1], "--layouts", RUNS[label][2],
                                *RUNS[label][3]) for label in labels],
                      check=False, extra_env={"OMP_NUM_THREADS": "1"})
        done = outputs(proc.stdout)
        assert [d["name"] for d in done] == ["check_layouts"] * len(labels), proc.stdout[-3000:] + proc.stderr[-3000:]
        found.update(zip(labels, done))
    return found


class Out:
    """One row's result, read as the tests read a finished process: returncode and stdout."""

    def __init__(self, run: dict):
        self.returncode, self.stdout, self.stderr = run["rc"], run["out"], ""


def test_four_ranks_all_layouts_agree(runs):
    out = Out(runs["four_ranks"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = parse_table(out.stdout)
    assert [r[:3] for r in rows] == [["tp1", "pp1", "dp4"], ["tp2", "pp1", "dp2"], ["tp1", "pp2", "dp2"],
                                      ["tp2", "pp2", "dp1"]]
    losses = [float(r[3]) for r in rows]
    assert max(losses) - min(losses) < 1e-5 * abs(losses[0])
    assert "PASS" in out.stdout


def test_two_ranks_sequence_parallel_entropy_and_seq_mean_loss(runs):
    """Sequence parallelism (on the TP2 layout) with an entropy bonus, GSPO and a sequence-mean loss."""
    out = Out(runs["sp_entropy"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "tp2 pp1 dp1 sp" in out.stdout and "PASS" in out.stdout


def test_tool_fails_when_layouts_differ(runs):
    """A tolerance of zero cannot be met by fp32 TP reductions: the tool must say FAIL and exit 1."""
    out = Out(runs["tolerance_zero"])
    assert out.returncode == 1 and "FAIL" in out.stdout


def test_packed_equals_padded_at_tp1_and_tp2_pp2(runs):
    """Sequence packing: packed micro-batches (ragged rows, several per micro-batch) at TP1 and TP2/PP2 give the
    padded TP1 numbers (losses, grad norms, log-probs and values before and after a step) within 1e-5."""
    out = Out(runs["packed_tp2pp2"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = parse_table(out.stdout)
    assert [r[3] if len(r) > 3 and not r[3][0].isdigit() else "" for r in rows] == ["", "packed", "", "packed"]
    assert "PASS" in out.stdout


def test_packed_sequence_parallel_seq_mean_loss(runs):
    """Packed length rounded to a TP multiple under sequence parallelism; a per-sequence loss (GSPO,
    seq-mean-token-mean) still sees rows, not packs."""
    out = Out(runs["packed_sp"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "tp2 pp1 dp1 sp packed" in out.stdout and "PASS" in out.stdout


def test_packed_auto_budget_two_ranks(runs):
    """The default budget (actor.max_tokens_per_gpu=0: micro_batch_size_per_gpu x the longest row) at DP2 and
    PP2 gives the padded numbers."""
    out = Out(runs["packed_auto"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "tp1 pp1 dp2 packed" in out.stdout and "tp1 pp2 dp1 packed" in out.stdout and "PASS" in out.stdout


def test_a_vision_lm_agrees_at_dp2_tp2_and_pp2_padded_and_packed(runs):
    """The tiny Qwen2.5-VL with an image opening every row (tools/layout_images.py): the tower, the image rows
    and the M-RoPE positions at DP2, TP2 and PP2 (the tower on the first stage), padded and packed."""
    out = Out(runs["vlm"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = parse_table(out.stdout)
    assert [" ".join(r[:3]) for r in rows] == ["tp1 pp1 dp2"] * 2 + ["tp2 pp1 dp1"] * 2 + ["tp1 pp2 dp1"] * 2
    assert [r[3] == "packed" for r in rows] == [False, True] * 3
    assert "PASS" in out.stdout


def test_qwen3_vl_agrees_at_dp2_and_tp2_padded_and_packed(runs):
    """The tiny Qwen3-VL: the tower's DeepStack levels added after LM layers 0 and 1 (forward hooks), interleaved
    M-RoPE, at DP2 and TP2, padded and packed."""
    out = Out(runs["vlm3"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = parse_table(out.stdout)
    assert [" ".join(r[:3]) for r in rows] == ["tp1 pp1 dp2"] * 2 + ["tp2 pp1 dp1"] * 2
    assert [r[3] == "packed" for r in rows] == [False, True] * 2
    assert "PASS" in out.stdout


def test_qwen3_vl_moe_agrees_at_dp2_and_ep2_padded_and_packed(runs):
    """The tiny Qwen3-VL-MoE: DeepStack into its 3 MoE layers, the experts split over EP2 (each rank's image and text
    tokens reach the other's experts), padded and packed (measured: log-probs within 4.8e-7 before and after a
    step, losses equal)."""
    out = Out(runs["vlm3_moe"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = parse_table(out.stdout)
    names = [" ".join(r[:len(r) - 8]) for r in rows]  # eight figures a row follow the layout's name
    assert names == ["tp1 pp1 dp2", "tp1 pp1 dp2 packed", "tp1 pp1 ep2 dp2", "tp1 pp1 ep2 dp2 packed"], names
    assert "PASS" in out.stdout


def test_ep_layouts_agree_with_1x1(runs):
    out = Out(runs["ep"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = parse_table(out.stdout)
    assert [r[:4] for r in rows] == [["tp1", "pp1", "dp4", rows[0][3]], ["tp1", "pp1", "ep2", "dp4"],
                                     ["tp1", "pp1", "ep4", "dp4"], ["tp2", "pp1", "ep2", "dp2"],
                                     ["tp2", "pp1", "ep4", "dp2"], ["tp1", "pp2", "ep2", "dp2"]]
    assert rows[3][4] == rows[4][4] == "sp"  # megatron's MoE layer at tp > 1 runs with sequence parallelism
    losses = [float(r[-8]) for r in rows]
    assert max(losses) - min(losses) <= 1e-6 * abs(losses[0]) and "PASS" in out.stdout


def test_layouts_the_model_cannot_take_are_one_line_each_exit_2():
    dense = check_layouts(0, "1x1,1x1x2")
    assert dense.returncode == 2
    assert "--layouts: 1x1x2: ep=2 must divide the expert count (got a dense model)." in dense.stderr
    bad = check_layouts(0, "1x1x3,2x1x1,1x1", config=MOE)
    lines = [line for line in bad.stderr.splitlines() if line.startswith("--layouts")]
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert lines == ["--layouts: 1x1x3: ep=3 must divide the expert count (got 8). Use an MoE config and a divisor "
                     "of its num_experts.",
                     "--layouts: 1x1x3: tp*pp = 1 and pp*ep = 3 must divide the world size 1. Launch a multiple "
                     "of both.",
                     "--layouts: 2x1x1: tp*pp = 2 and pp*ep = 1 must divide the world size 1. Launch a multiple "
                     "of both."]


def test_lora_actor_and_critic_agree_at_every_layout_after_three_steps(runs):
    out = Out(runs["lora"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = parse_table(out.stdout)
    assert [r[:3] for r in rows] == [["tp1", "pp1", "dp4"], ["tp2", "pp1", "dp2"], ["tp1", "pp2", "dp2"],
                                      ["tp2", "pp2", "dp1"]]
    moved = re.search(r"actor logp ([0-9.e+-]+), values ([0-9.e+-]+)", out.stdout)
    assert float(moved[1]) > 1e-2 and float(moved[2]) > 1e-2  # the adapters trained: the comparison means something
    assert "PASS" in out.stdout


def test_lora_packed_equals_padded_at_tp1_and_tp2(runs):
    """Sequence packing with adapters (two ranks): packed micro-batches at TP1 and TP2 give the padded TP1
    numbers after two steps, with sequence parallelism on at TP2 (the adapters' gather / reduce-scatter)."""
    out = Out(runs["lora_packed"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "tp2 pp1 dp1 sp packed" in out.stdout and "PASS" in out.stdout


@pytest.mark.parametrize("run", ["lora_moe", "lora_moe_grouped"])
def test_lora_on_an_moe_model_agrees_at_ep2_and_tp2(runs, run):
    """LoRA on the tiny Qwen3-MoE (attention and every expert adapted, router frozen): EP2 and TP2 (sequence
    parallel) give the TP1 numbers after three steps, for the actor and a LoRA critic, with megatron's expert loop
    (hooks) and with the grouped experts (low-rank grouped GEMMs)."""
    out = Out(runs[run])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "tp1 pp1 ep2 dp2" in out.stdout and "tp2 pp1 dp1 sp" in out.stdout and "PASS" in out.stdout
    moved = re.search(r"actor logp ([0-9.e+-]+), values ([0-9.e+-]+)", out.stdout)
    assert float(moved[1]) > 1e-2 and float(moved[2]) > 1e-2


def test_full_moe_at_tp2_sequence_parallel_equals_1x1_after_three_steps(runs):
    # actor lr 1e-3 (the preset's 1e-2 also passes): Adam's first steps scale each gradient element by 1/(|g| + eps),
    # so elements with |g| ~ eps turn fp32 summation-order noise into ~1e-5 log-prob differences at lr 1e-2
    out = Out(runs["moe_tp2_sp"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = parse_table(out.stdout)
    assert rows[0][:3] == ["tp1", "pp1", "dp2"] and rows[1][:4] == ["tp2", "pp1", "dp1", "sp"]
    assert rows[2][:5] == ["tp2", "pp1", "ep2", "dp1", "sp"]  # the expert group is the TP pair (dp 1)
    moved = re.search(r"actor logp ([0-9.e+-]+), values ([0-9.e+-]+)", out.stdout)
    assert float(moved[1]) > 1e-1 and float(moved[2]) > 1e-2  # the experts trained: the comparison means something
    assert "PASS" in out.stdout
