"""rollout.mode=multi_turn config: the tiny tool preset validates; each bad rollout.multi_turn field is one
error line naming its dotted key (exit 2, no traceback), checked before any model is built; verl's
multi_turn keys translate to ours."""

import pytest

from rlhf_mcore.config.load import load_config
from tests.support.paths import ROOT
from tests.support.validate_only import validate_only_errors

TOOL = str(ROOT / "configs" / "tiny_tool_grpo.yaml")
TINY = str(ROOT / "configs" / "tiny_grpo.yaml")


def errors(capsys, *overrides: str, config: str = TOOL) -> list[str]:
    return validate_only_errors(capsys, config, *overrides)


def test_the_tiny_tool_preset_validates(capsys):
    assert errors(capsys) == []


@pytest.mark.parametrize("overrides,start,words", [
    (("rollout.multi_turn.tools=[calculater]",), "rollout.multi_turn.tools: unknown tool 'calculater'",
     "Did you mean 'calculator'?"),
    (("rollout.multi_turn.parser=hermez",), "rollout.multi_turn.parser: must be one of hermes", "hermez"),
    (("rollout.multi_turn.tools=[]",), "rollout.multi_turn.tools: multi_turn needs at least one tool",
     "rollout.multi_turn.tools=[python]"),
    (("rollout.multi_turn.tools_file=/nonexistent/tools.py",), "rollout.multi_turn.tools:", "/nonexistent/tools.py"),
    (("rollout.multi_turn.max_turns=0",), "rollout.multi_turn.max_turns", "0"),
    (("rollout.multi_turn.tool_timeout_s=-1",), "rollout.multi_turn.tool_timeout_s", "-1"),
    (("rollout.mode=multiturn",), "rollout.mode", "multi_turn"),
])
def test_a_bad_multi_turn_field_is_one_line_naming_it(capsys, overrides, start, words):
    lines = errors(capsys, *overrides)
    assert len(lines) == 1 and lines[0].startswith(start) and words in lines[0], lines


def test_single_turn_ignores_the_multi_turn_section(capsys):
    assert errors(capsys, "rollout.multi_turn.parser=hermez", config=TINY) == []


def test_verl_multi_turn_keys_translate():
    cfg = load_config(TINY, ["actor_rollout_ref.rollout.multi_turn.enable=true",
                             "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5",
                             "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2",
                             "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=300",
                             "rollout.multi_turn.tools=[calculator]"], check=False)
    m = cfg.rollout.multi_turn
    assert (cfg.rollout.mode, m.max_turns, m.max_tool_calls, m.max_tool_response_chars) == ("multi_turn", 5, 2, 300)


def test_the_prompt_length_check_counts_the_tool_schemas(capsys):
    """Every multi-turn prompt carries the tools' schemas (the calculator's, as a system message): at
    data.max_prompt_length=200 the tiny prompts fit alone but not with it, and --validate-only says so before any
    model is built (it used to pass, and the run stopped later on "no prompts left" with a traceback)."""
    assert errors(capsys, "data.max_prompt_length=200", config=TINY) == []  # the plain prompts fit
    lines = errors(capsys, "data.max_prompt_length=200")
    assert lines[0].startswith("data.train_files: ") and "only 0 of 256 prompts fit data.max_prompt_length=200 " \
        "tokens (256 longer with the 1 tool schema(s) rendered into each)" in lines[0], lines
