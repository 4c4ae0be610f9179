"""Chat-template text around tool calls: the prompt with the tools' schemas, and the tokens a tool turn adds.

Token in, token out: the policy's sampled ids are never decoded and re-encoded. What the rollout appends
between two assistant turns (the end of the assistant message, the tool messages, the next assistant
generation prompt) is rendered by the tokenizer's own chat template and encoded once, as a delta:

    delta text = render(conversation + tool messages, generation prompt) minus everything up to the end
                 of the last assistant message's content

The conversation before the tool messages is a fixed placeholder (one user message and one assistant
message `PLACEHOLDER`), so the delta never depends on the prompt or on what the model wrote, only on the
template and the tool results. A tokenizer whose template cannot render tools (`supports_tools` false: no
`tools` in its template, the byte and plain tokenizers) gets the schemas as a system message in hermes
style, the format Qwen2.5/Qwen3 templates write themselves.

>>> from rlhf_mcore.tokenizer_bytes import ByteTokenizer
>>> tool_delta_text(ByteTokenizer(), ["42"])
'\\ntool: 42\\nassistant:'
"""
from __future__ import annotations

import json
from typing import Sequence

PLACEHOLDER = "\u2063PLACEHOLDER\u2063"  # invisible separators: never part of a real message
_BASE = ({"role": "user", "content": "Q"}, {"role": "assistant", "content": PLACEHOLDER})


def tools_instruction(schemas: Sequence[dict]) -> str:
    """The hermes-style tool instructions (Qwen2.5's wording) for templates that cannot render `tools`.

    >>> print(tools_instruction([{"type": "function", "function": {"name": "calc"}}]).splitlines()[0])
    # Tools
    """
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{lines}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def supports_tools(tokenizer) -> bool:
    return bool(getattr(tokenizer, "supports_tools", False))


def with_tools(messages: Sequence[dict], schemas: Sequence[dict]) -> list[dict]:
    """`messages` with the tool instructions in the system message (added first when there is none)."""
    messages = [dict(m) for m in messages]
    text = tools_instruction(schemas)
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{text}"
        return messages
    return [{"role": "system", "content": text}, *messages]


def render_prompt(tokenizer, messages: Sequence[dict], schemas: Sequence[dict] = ()) -> str:
    """The prompt text with a generation prompt; with `schemas`, the tools as the template renders them
    (`tools=`), else as a system message (`with_tools`)."""
    if not schemas:
        return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True)
    if supports_tools(tokenizer):
        return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tools=list(schemas))
    return tokenizer.apply_chat_template(with_tools(messages, schemas), add_generation_prompt=True)


def tool_delta_text(tokenizer, results: Sequence[str], sampled_end: str = "") -> str:
    """The text between the end of an assistant message's content and the next assistant turn's first
    token: the template's end of the assistant message, one tool message per result, the generation prompt.
    `sampled_end`: the end-of-turn token's text when the policy sampled it (rollout.multi_turn.turn_end=sampled):
    the text after it."""
    tool_msgs = [{"role": "tool", "content": r} for r in results]
    full = tokenizer.apply_chat_template([*_BASE, *tool_msgs], add_generation_prompt=True)
    at = full.find(PLACEHOLDER)
    if at < 0:
        raise ValueError("chat template: the assistant message's content does not appear in the rendered "
                         "conversation; multi-turn rollouts need a template that writes assistant messages verbatim")
    delta = full[at + len(PLACEHOLDER):]
    if not sampled_end:
        return delta
    if not delta.startswith(sampled_end):
        raise ValueError(f"chat template: an assistant message does not end with {sampled_end!r} right after its "
                         "content; rollout.multi_turn.turn_end=sampled needs one. Use turn_end=template.")
    return delta[len(sampled_end):]


def tool_delta_ids(tokenizer, results: Sequence[str], sampled_end: str = "") -> list[int]:
    """`tool_delta_text` encoded once (the appended tokens; the loss mask is 0 on them)."""
    return list(tokenizer.encode(tool_delta_text(tokenizer, results, sampled_end)))
