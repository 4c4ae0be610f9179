"""The core promise: the same loss, grad norm and per-token outputs at every TP/PP/DP layout.

Runs the shipped tool under torchrun with gloo (world sizes 1, 2 and 4)."""
import pytest

from tests.support.layouts import check_layouts, parse_table

pytestmark = pytest.mark.dist


def run_tool(nproc: int, layouts: str, *overrides: str):
    return check_layouts(nproc, layouts, *overrides)


def test_four_ranks_all_layouts_agree():
    out = run_tool(4, "1x1,2x1,1x2,2x2")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = parse_table(out.stdout)
    assert [r[:3] for r in rows] == [["tp1", "pp1", "dp4"], ["tp2", "pp1", "dp2"], ["tp1", "pp2", "dp2"],
                                      ["tp2", "pp2", "dp1"]]
    losses = [float(r[3]) for r in rows]
    assert max(losses) - min(losses) < 1e-5 * abs(losses[0])
    assert "PASS" in out.stdout


def test_two_ranks_sequence_parallel_entropy_and_seq_mean_loss():
    """Sequence parallelism (on the TP2 layout) with an entropy bonus, GSPO and a sequence-mean loss."""
    out = run_tool(2, "1x1,2x1,1x2", "--sequence-parallel", "actor.use_kl_loss=false", "actor.entropy_coeff=0.01",
                   "actor.loss_agg_mode=seq-mean-token-mean", "actor.policy_loss=gspo")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "tp2 pp1 dp1 sp" in out.stdout and "PASS" in out.stdout


def test_tool_fails_when_layouts_differ():
    """A tolerance of zero cannot be met by fp32 TP reductions: the tool must say FAIL and exit 1."""
    out = run_tool(2, "1x1,2x1", "--tolerance", "0")
    assert out.returncode == 1 and "FAIL" in out.stdout


def test_packed_equals_padded_at_tp1_and_tp2_pp2():
    """Sequence packing: packed micro-batches (ragged rows, several per micro-batch) at TP1 and TP2/PP2 give the
    padded TP1 numbers (losses, grad norms, log-probs and values before and after a step) within 1e-5."""
    out = run_tool(4, "1x1,2x2", "--packing", "both", "--max-tokens", "40")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = parse_table(out.stdout)
    assert [r[3] if len(r) > 3 and not r[3][0].isdigit() else "" for r in rows] == ["", "packed", "", "packed"]
    assert "PASS" in out.stdout


def test_packed_sequence_parallel_seq_mean_loss():
    """Packed length rounded to a TP multiple under sequence parallelism; a per-sequence loss (GSPO,
    seq-mean-token-mean) still sees rows, not packs."""
    out = run_tool(2, "1x1,2x1", "--packing", "on", "--sequence-parallel", "--max-tokens", "45",
                   "actor.loss_agg_mode=seq-mean-token-mean", "actor.policy_loss=gspo", "actor.entropy_coeff=0.01")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "tp2 pp1 dp1 sp packed" in out.stdout and "PASS" in out.stdout


def test_packed_auto_budget_two_ranks():
    """The default budget (actor.max_tokens_per_gpu=0: micro_batch_size_per_gpu x the longest row) at DP2 and
    PP2 gives the padded numbers."""
    out = run_tool(2, "1x1,1x2", "--packing", "both")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "tp1 pp1 dp2 packed" in out.stdout and "tp1 pp2 dp1 packed" in out.stdout and "PASS" in out.stdout
