"""verl's grading tools as built-ins (rlhf_mcore/agent/grading_tools.py): calc_gsm8k_reward and calc_geo3k_reward
reply as verl's Gsm8kTool and Geo3kTool do (verl/tools/gsm8k_tool.py, geo3k_tool.py: ``Current parsed {answer=}
{reward=}``, the GSM8K answer prefixed with '#### ' and graded by the flexible rule, the Geometry3K answer graded
whole with no format credit), with the row's ground truth from its tools_kwargs; verl's tool_config_path maps
their classes to them."""
import pytest

from rlhf_mcore.agent.executor import ToolExecutor
from rlhf_mcore.agent.parsers import ToolCall
from rlhf_mcore.agent.tools import load_tools
from rlhf_mcore.config.load import ConfigError, load_config

GSM8K, GEO3K = "calc_gsm8k_reward", "calc_geo3k_reward"
VERL_GSM8K_CONFIG = """tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k"
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The answer to the question"
          required: ["answer"]
"""


def run(calls: list[tuple[str, str]], truth) -> list:
    """Each (tool, answer) through the executor, with the row's tools_kwargs carrying `truth` to both tools."""
    kwargs = {GSM8K: {"ground_truth": truth}, GEO3K: {"ground_truth": truth}} if truth is not None else None
    with ToolExecutor(load_tools([GSM8K, GEO3K], None), timeout_s=5, max_output_chars=200, memory_mb=256,
                      workers=2) as ex:
        return ex.run([ToolCall(t, {"answer": a}) for t, a in calls], [kwargs] * len(calls))


@pytest.mark.parametrize("answer, truth, reward", [
    ("72", "72", 1.0), ("#### 72", "72", 1.0),  # verl adds '#### ' unless the answer has it
    ("71", "72", 0.0), ("$1,000", "1000", 1.0),  # flexible: the last number, commas and $ dropped
    ("The answer is 18.", "18", 1.0), ("none", "18", 0.0)])
def test_gsm8k_tool_replies_as_verls(answer, truth, reward):
    [result] = run([(GSM8K, answer)], truth)
    assert result.error is None and result.text == f"Current parsed answer={answer!r} reward={reward!r}"


@pytest.mark.parametrize("answer, truth, reward", [
    ("3", "3", 1.0), ("\\frac{\\sqrt3}{2}", "\\frac{\\sqrt{3}}{2}", 1.0),  # graded by value, no format weight
    ("45", "60", 0.0)])
def test_geo3k_tool_replies_as_verls(answer, truth, reward):
    [result] = run([(GEO3K, answer)], truth)
    assert result.error is None and result.text == f"Current parsed answer={answer!r} reward={reward!r}"


def test_a_row_without_ground_truth_gets_an_error_naming_where_it_goes():
    results = run([(GSM8K, "72"), (GEO3K, "3")], None)
    for result, tool in zip(results, (GSM8K, GEO3K)):
        assert result.error == "exception" and f"extra_info.tools_kwargs.{tool}.create_kwargs.ground_truth" in \
            result.text, result.text


def test_verls_tool_config_path_names_the_built_ins(tmp_path):
    path = tmp_path / "gsm8k_tool_config.yaml"
    path.write_text(VERL_GSM8K_CONFIG)
    cfg = load_config(None, [f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path}",
                             "actor_rollout_ref.rollout.multi_turn.enable=True"], check=False)
    assert cfg.rollout.multi_turn.tools == [GSM8K] and cfg.rollout.mode == "multi_turn"
    other = tmp_path / "search.yaml"
    other.write_text(VERL_GSM8K_CONFIG.replace("gsm8k_tool.Gsm8kTool", "search_tool.SearchTool"))
    for bad, says in ((other, "tools[0].class_name 'verl.tools.search_tool.SearchTool' has no built-in here"),
                      (tmp_path / "missing.yaml", "no such file")):
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"actor_rollout_ref.rollout.multi_turn.tool_config_path={bad}"], check=False)
        lines = [e for e in err.value.errors if "tool_config_path" in e]
        assert len(lines) == 1 and says in lines[0] and str(bad) in lines[0], err.value.errors
