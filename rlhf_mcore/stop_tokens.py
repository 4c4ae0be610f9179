"""The stop set: every token id that ends a response, resolved in one place for both rollout engines.

A response ends at its first token in the stop set (the token is kept). The set is the union, in this order, of

- the tokenizer's eos (``tokenizer_config.json``),
- ``generation_config.json``'s ``eos_token_id``: an int or a list (Llama-3-Instruct lists ``<|eot_id|>`` and
  ``<|end_of_text|>``, Qwen2.5-Instruct ``<|im_end|>`` and ``<|endoftext|>``),
- ``config.json``'s ``eos_token_id`` (int or list),
- the chat template's end-of-turn token (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``): the special token
  the template writes right after every assistant message (`end_of_turn_token`).

The pad token is never added for being the pad token: padding is filler after a response's end, and the
response lengths say where each response ends (a pad id that equals an eos id is in the set as that eos).
When the tokenizer's eos is not among the config's eos ids, `eos_disagreement` gives the start-up warning;
the union is used either way.

>>> stop_set(StopSources(tokenizer_eos=1, generation_eos=(2,), config_eos=(2,), end_of_turn=2))
(1, 2)
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Mapping, Optional, Sequence

# Replies the chat template is rendered with to find what it writes after an assistant message.
PROBE_REPLIES = ("Probe reply one.", "Probe reply two.")


@dataclasses.dataclass(frozen=True)
class StopSources:
    tokenizer_eos: Optional[int]
    generation_eos: tuple[int, ...] = ()  # generation_config.json eos_token_id
    config_eos: tuple[int, ...] = ()  # config.json eos_token_id
    end_of_turn: Optional[int] = None  # the chat template's end-of-turn token

    @property
    def model_eos(self) -> tuple[int, ...]:
        """The eos ids of the model's own config files (generation_config.json, then config.json)."""
        return tuple(dict.fromkeys(self.generation_eos + self.config_eos))


def as_id_list(value) -> tuple[int, ...]:
    """An ``eos_token_id`` field (None, an int or a list of ints) as a tuple of ids.

    >>> as_id_list(None), as_id_list(2), as_id_list([128001, 128009])
    ((), (2,), (128001, 128009))
    """
    if value is None:
        return ()
    return tuple(int(i) for i in value) if isinstance(value, (list, tuple)) else (int(value),)


def stop_set(sources: StopSources) -> tuple[int, ...]:
    """The union of every source, first occurrence first, without duplicates.

    >>> stop_set(StopSources(tokenizer_eos=128009, generation_eos=(128001, 128008, 128009), config_eos=(128001,)))
    (128009, 128001, 128008)
    >>> stop_set(StopSources(tokenizer_eos=None, end_of_turn=7))
    (7,)
    """
    first = () if sources.tokenizer_eos is None else (sources.tokenizer_eos,)
    last = () if sources.end_of_turn is None else (sources.end_of_turn,)
    return tuple(dict.fromkeys(first + sources.generation_eos + sources.config_eos + last))


def end_of_turn_token(render: Callable[[list], str], special_tokens: Mapping[str, int]) -> Optional[int]:
    """The special token that `render` (messages -> text, no generation prompt) writes right after every
    assistant message, whitespace aside; None when there is none, or when two assistant turns end differently.

    >>> chatml = lambda msgs: "".join(f"<|im_start|>{m['role']}\\n{m['content']}<|im_end|>\\n" for m in msgs)
    >>> end_of_turn_token(chatml, {"<|im_start|>": 1, "<|im_end|>": 2})
    2
    >>> llama2 = lambda msgs: "".join(f"[INST] {m['content']} [/INST]" if m["role"] == "user" else
    ...                               f" {m['content']} </s>" for m in msgs)
    >>> end_of_turn_token(llama2, {"</s>": 2, "<s>": 1})
    2
    >>> print(end_of_turn_token(lambda msgs: "\\n\\n".join(m["content"] for m in msgs), {"</s>": 2}))
    None
    """
    turns = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": PROBE_REPLIES[0]},
             {"role": "user", "content": "More."}, {"role": "assistant", "content": PROBE_REPLIES[1]}]
    for messages in (turns, turns[:2]):
        try:
            text = render(messages)
        except Exception:  # noqa: BLE001 - a template that refuses this conversation: try the shorter one
            continue
        replies = [r for r in PROBE_REPLIES if r in text]
        found = {_special_at(text.split(r, 1)[1].lstrip(), special_tokens) for r in replies}
        if replies:
            return found.pop() if len(found) == 1 else None
    return None


def _special_at(text: str, special_tokens: Mapping[str, int]) -> Optional[int]:
    """The id of the longest special token that `text` starts with, else None."""
    matches = [t for t in special_tokens if t and text.startswith(t)]
    return special_tokens[max(matches, key=len)] if matches else None


def eos_disagreement(sources: StopSources, token: Callable[[int], str]) -> Optional[str]:
    """One warning line when the tokenizer's eos is not one of the model config's eos ids (None when it is,
    or when either side has none). `token(id)` gives the token's text.

    >>> print(eos_disagreement(StopSources(1, (2,), (2,), 2), {1: "<|im_start|>", 2: "<|im_end|>"}.get))
    model.tokenizer: its eos is 1 '<|im_start|>' but the model's config (generation_config.json, config.json) \
says 2 '<|im_end|>' (got tokenizer eos 1, config eos [2]). Generation stops at any of the union [1, 2]; fix \
eos_token in tokenizer_config.json (or re-export the model) if the tokenizer is wrong.
    """
    model = sources.model_eos
    if sources.tokenizer_eos is None or not model or sources.tokenizer_eos in model:
        return None
    theirs = ", ".join(f"{i} {token(i)!r}" for i in model)
    return (f"model.tokenizer: its eos is {sources.tokenizer_eos} {token(sources.tokenizer_eos)!r} but the model's "
            f"config (generation_config.json, config.json) says {theirs} (got tokenizer eos {sources.tokenizer_eos}, "
            f"config eos {list(model)}). Generation stops at any of the union {list(stop_set(sources))}; fix "
            "eos_token in tokenizer_config.json (or re-export the model) if the tokenizer is wrong.")


def describe(ids: Sequence[int], token: Callable[[int], str]) -> str:
    """The start-up line naming the resolved stop set.

    >>> describe((2, 0), {2: "<|im_end|>", 0: "<|endoftext|>"}.get)
    "stop tokens: 2 '<|im_end|>', 0 '<|endoftext|>' (any of them ends a response)"
    """
    return "stop tokens: " + ", ".join(f"{i} {token(i)!r}" for i in ids) + " (any of them ends a response)"


def read_model_eos(hf_path: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(generation_config.json eos ids, config.json eos ids) of an HF model directory; () for a missing file."""
    found = []
    for name in ("generation_config.json", "config.json"):
        path = os.path.join(hf_path, name) if hf_path else ""
        if path and os.path.isfile(path):
            with open(path) as f:
                found.append(as_id_list(json.load(f).get("eos_token_id")))
        else:
            found.append(())
    return found[0], found[1]


def stop_sources(tokenizer, hf_path: str) -> StopSources:
    """Every source of the stop set for a run's tokenizer (`rlhf_mcore.tokenizer`) and model directory."""
    generation, config = read_model_eos(hf_path)
    special = getattr(tokenizer, "special_tokens", None)
    end = None
    if special:
        end = end_of_turn_token(lambda m: tokenizer.apply_chat_template(m, add_generation_prompt=False), special)
    return StopSources(tokenizer_eos=tokenizer.eos_id, generation_eos=generation, config_eos=config, end_of_turn=end)
