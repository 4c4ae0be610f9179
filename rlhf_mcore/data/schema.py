"""verl's prompt-row schema and its validation.

A row has ``data_source`` (str, picks the reward), ``prompt`` (a list of chat messages ``{role, content}``),
``ability`` (str, optional), ``reward_model`` (``{"style": str, "ground_truth": ...}``), ``extra_info``
(a dict, optional) and ``images`` (optional: one image per ``<image>`` placeholder of the prompt, as bytes, paths
or ``{"bytes", "path"}`` dicts, as verl writes them). ``check_row`` raises a ValueError that names the row and the bad
field.

>>> row = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "1+1?"}],
...        "ability": "math", "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": None}
>>> check_row(row, "train.parquet: row 0")
PromptRow(index=0, data_source='openai/gsm8k', messages=({'role': 'user', 'content': '1+1?'},), \
ability='math', ground_truth='2', extra_info={}, images=(), prompt_ids=(), image_grid_thw=())
>>> check_row({**row, "prompt": []}, "train.parquet: row 3")
Traceback (most recent call last):
...
ValueError: train.parquet: row 3: prompt: must be a non-empty list of chat messages (got []).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rlhf_mcore.data.images import check_placeholders, image_sources

REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class PromptRow:
    index: int  # row index in its source file
    data_source: str
    messages: tuple[dict, ...]  # chat messages, {"role", "content"}
    ability: str
    ground_truth: Any
    extra_info: dict
    images: tuple = ()  # bytes or paths, one per <image> of the messages
    prompt_ids: tuple[int, ...] = ()  # chat-templated prompt tokens, filled in by load_prompt_dataset
    image_grid_thw: tuple = ()  # (t, h, w) patch grid per image, filled in with prompt_ids (vision models)

    def with_ids(self, ids: list[int], grids: tuple = (), images: tuple | None = None) -> PromptRow:
        return replace(self, prompt_ids=tuple(ids), image_grid_thw=tuple(grids),
                       images=self.images if images is None else tuple(images))


def _fail(where: str, problem: str) -> None:
    raise ValueError(f"{where}: {problem}.")


def check_messages(prompt: Any, where: str) -> tuple[dict, ...]:
    """Chat messages as a tuple of ``{"role", "content"}`` dicts; raise on anything else."""
    if not isinstance(prompt, (list, tuple)) or not prompt:
        _fail(where, f"prompt: must be a non-empty list of chat messages (got {prompt!r})")
    messages = []
    for k, msg in enumerate(prompt):
        if not isinstance(msg, dict):
            _fail(where, f"prompt[{k}]: must be a dict with role and content (got {type(msg).__name__})")
        role, content = msg.get("role"), msg.get("content")
        if role not in ROLES:
            _fail(where, f"prompt[{k}].role: must be one of {', '.join(ROLES)} (got {role!r})")
        if not isinstance(content, str):
            _fail(where, f"prompt[{k}].content: must be a string (got {type(content).__name__})")
        messages.append({"role": role, "content": content})
    return tuple(messages)


def check_row(row: Any, where: str, index: int = 0) -> PromptRow:
    """The validated row; ``where`` (e.g. ``"train.parquet: row 12"``) starts every error message."""
    if not isinstance(row, dict):
        _fail(where, f"must be a dict (got {type(row).__name__})")
    data_source = row.get("data_source")
    if not isinstance(data_source, str) or not data_source:
        _fail(where, f"data_source: must be a non-empty string (got {data_source!r})")
    messages = check_messages(row.get("prompt"), where)
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        _fail(where, f"reward_model: must be a dict with a ground_truth (got {reward_model!r})")
    ability = row.get("ability")
    if ability is not None and not isinstance(ability, str):
        _fail(where, f"ability: must be a string (got {type(ability).__name__})")
    extra_info = row.get("extra_info")
    if extra_info is not None and not isinstance(extra_info, dict):
        _fail(where, f"extra_info: must be a dict (got {type(extra_info).__name__})")
    images = image_sources(row.get("images"), where)
    if row.get("images") is not None:  # a text row may say "<image>" in its text
        check_placeholders(messages, len(images), where)
    return PromptRow(
        index=index,
        data_source=data_source,
        messages=messages,
        ability=ability or "",
        ground_truth=reward_model["ground_truth"],
        extra_info=dict(extra_info or {}),
        images=images,
    )


def make_row(data_source: str, question: str, ability: str, ground_truth: Any, extra_info: dict) -> dict:
    """One verl-schema row with a single user message (what the prepare_* tools write).

    >>> make_row("math", "1+1?", "math", "2", {"index": 0})["reward_model"]
    {'style': 'rule', 'ground_truth': '2'}
    """
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
    }
