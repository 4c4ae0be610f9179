"""Expert parallelism keeps the core promise: tools/check_layouts.py on the tiny MoE preset (configs/tiny_moe_grpo.yaml:
a random 4-layer Qwen3-MoE, 8 experts top-2) gives the 1x1 loss, grad norm and per-token log-probs / values (before
and after an optimizer step) at EP2, EP4, TP2xEP2 (sequence parallel) and PP2xEP2 (gloo, 4 ranks); the random
experts are drawn per global expert index, so every layout builds the same model. Layouts the model or the
world cannot take stop before any model is built: one line each, exit 2 (one plain process: torchrun reports
any failing rank as 1)."""
import pytest

from tests.support.layouts import check_layouts, parse_table

pytestmark = pytest.mark.dist
MOE = "tiny_moe_grpo.yaml"


def run_tool(nproc: int, config: str, layouts: str, *extra: str):
    """Under torchrun (nproc > 0), or as one plain process (nproc 0: its own exit code, world size 1)."""
    return check_layouts(nproc, layouts, *extra, config=config)


def test_ep_layouts_agree_with_1x1():
    out = run_tool(4, MOE, "1x1,1x1x2,1x1x4,2x1x2,1x2x2")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = parse_table(out.stdout)
    assert [r[:4] for r in rows] == [["tp1", "pp1", "dp4", rows[0][3]], ["tp1", "pp1", "ep2", "dp4"],
                                     ["tp1", "pp1", "ep4", "dp4"], ["tp2", "pp1", "ep2", "dp2"],
                                     ["tp1", "pp2", "ep2", "dp2"]]
    assert rows[3][4] == "sp"  # megatron's MoE layer at tp > 1 runs with sequence parallelism
    losses = [float(r[-8]) for r in rows]
    assert max(losses) - min(losses) <= 1e-6 * abs(losses[0]) and "PASS" in out.stdout


def test_layouts_the_model_cannot_take_are_one_line_each_exit_2():
    dense = run_tool(0, "tiny_grpo.yaml", "1x1,1x1x2")
    assert dense.returncode == 2
    assert "--layouts: 1x1x2: ep=2 must divide the expert count (got a dense model)." in dense.stderr
    bad = run_tool(0, MOE, "1x1x3,2x1x1,1x1")
    lines = [line for line in bad.stderr.splitlines() if line.startswith("--layouts")]
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert lines == ["--layouts: 1x1x3: ep=3 must divide the expert count (got 8). Use an MoE config and a divisor "
                     "of its num_experts.",
                     "--layouts: 1x1x3: tp*pp*ep = 3 must divide the world size 1. Launch a multiple of it.",
                     "--layouts: 2x1x1: tp*pp*ep = 2 must divide the world size 1. Launch a multiple of it."]
