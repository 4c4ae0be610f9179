"""verl's two grading tools as built-ins: ``calc_gsm8k_reward`` (verl's `Gsm8kTool`) and ``calc_geo3k_reward``
(`Geo3kTool`), the tools of verl's multi-turn GSM8K and Geometry3K recipes. The policy submits an answer and reads
back how it scores against the row's ground truth, which reaches the tool as its context: verl's
``extra_info.tools_kwargs.<tool>.create_kwargs.ground_truth`` (`rollout.modes.multi_turn.tools_kwargs`).

Each returns verl's text, ``Current parsed answer='72' reward=1.0`` (Python's ``{answer=} {reward=}``):
- gsm8k: the answer prefixed with ``#### `` unless it has it, scored by the flexible GSM8K rule (1 right, else 0);
- geo3k: the answer scored as a whole (no ``\\boxed{}`` needed) by the Geometry3K grader, no format credit.

verl's per-call tool reward (-0.05 for an answer that does not improve on the sample's last) is not applied: the
sample's reward is its data source's, as in verl's recipes, whose reward functions score the response.

verl's ``rollout.multi_turn.tool_config_path`` names these tools by class (`VERL_TOOL_CLASSES`): `verl_tool_names`
reads such a file into our tool names.

>>> GSM8K_TOOL.fn({"answer": "72"}, {"ground_truth": "72"})
"Current parsed answer='72' reward=1.0"
>>> GEO3K_TOOL.fn({"answer": "45"}, {"ground_truth": "60"})
"Current parsed answer='45' reward=0.0"
"""
from __future__ import annotations

from pathlib import Path

from rlhf_mcore.agent.schema import Tool
from rlhf_mcore.rewards.geometry3k import compute_geo3k_score
from rlhf_mcore.rewards.gsm8k import compute_gsm8k_score


def ground_truth(context: dict, tool: str):
    """The row's ground truth for `tool` (its tools_kwargs); ValueError naming where it goes when it is missing."""
    truth = (context or {}).get("ground_truth")
    if truth is None:
        raise ValueError(f"{tool} needs the row's ground truth: set extra_info.tools_kwargs.{tool}.create_kwargs."
                         "ground_truth in the data (verl's multi-turn preprocessing writes it)")
    return truth


def report(answer: str, reward: float) -> str:
    """verl's reply: ``Current parsed {answer=} {reward=}``."""
    return f"Current parsed answer={answer!r} reward={float(reward)!r}"


def gsm8k_reward(arguments: dict, context: dict) -> str:
    answer = str(arguments.get("answer", ""))
    graded = answer if answer.startswith("#### ") else "#### " + answer
    truth = ground_truth(context, "calc_gsm8k_reward")
    return report(answer, compute_gsm8k_score("openai/gsm8k", graded, truth, method="flexible")["score"])


def geo3k_reward(arguments: dict, context: dict) -> str:
    answer = str(arguments.get("answer", ""))
    truth = ground_truth(context, "calc_geo3k_reward")
    score = compute_geo3k_score("hiyouga/geometry3k", answer, truth, use_boxed=False, format_score=0.0)["score"]
    return report(answer, score)


def _answer(description: str) -> dict:
    return {"type": "object", "properties": {"answer": {"type": "string", "description": description}},
            "required": ["answer"]}


GSM8K_TOOL = Tool(name="calc_gsm8k_reward", description="A tool for calculating the reward of gsm8k",
                  parameters=_answer("The answer to the question"), fn=gsm8k_reward, sandboxed=False,
                  origin="rlhf_mcore.agent.grading_tools:gsm8k_reward")
GEO3K_TOOL = Tool(name="calc_geo3k_reward", description="A tool for calculating the reward of geo3k",
                  parameters=_answer("The answer to the question, enclosed in \\boxed{}"), fn=geo3k_reward,
                  sandboxed=False, origin="rlhf_mcore.agent.grading_tools:geo3k_reward")

# verl's tool classes (tool_config_path's `class_name`) -> our built-in of the same behaviour
VERL_TOOL_CLASSES = {"verl.tools.gsm8k_tool.Gsm8kTool": GSM8K_TOOL.name,
                     "verl.tools.geo3k_tool.Geo3kTool": GEO3K_TOOL.name}


def verl_tool_names(path: str) -> list[str]:
    """Our tool names for verl's tool config file (``tools: [{class_name: ..., tool_schema: ...}, ...]``); ValueError
    naming the file and the class we do not have."""
    import yaml

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"verl tool config {path}: no such file. Give the path of verl's tool YAML "
                         "(e.g. examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml)")
    entries = (yaml.safe_load(file.read_text()) or {}).get("tools") or []
    names = []
    for i, entry in enumerate(entries):
        cls = (entry or {}).get("class_name", "")
        if cls not in VERL_TOOL_CLASSES:
            raise ValueError(f"verl tool config {path}: tools[{i}].class_name {cls!r} has no built-in here (we have "
                             f"{', '.join(VERL_TOOL_CLASSES)}). Write it as a custom tool (rollout.multi_turn."
                             "tools_file, docs/multi_turn.md) and name it in rollout.multi_turn.tools")
        names.append(VERL_TOOL_CLASSES[cls])
    if not names:
        raise ValueError(f"verl tool config {path}: no tools listed under `tools:`")
    return names
