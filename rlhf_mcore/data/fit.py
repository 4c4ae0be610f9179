"""Whether a data file can feed the run, checked before any model is built: enough prompts that fit
`data.max_prompt_length` tokens for one `data.train_batch_size` batch (a validation file: one prompt), and no
prompt that the loader would refuse later.

Tokenising stops as soon as enough prompts fit (`need`), so a large file costs a few batches of tokenisation;
only a file that cannot fill a batch (or `filter_overlong=False`, where every prompt must fit) is read to the end.

>>> class Chars:
...     def apply_chat_template(self, messages, add_generation_prompt=True):
...         return "".join(m["content"] for m in messages)
...     def encode(self, text):
...         return [ord(c) for c in text]
>>> from rlhf_mcore.data.schema import check_row, make_row
>>> rows = [("x.parquet", check_row(make_row("s", q, "t", "1", {}), "r", i)) for i, q in enumerate(["hi", "a long"])]
>>> fit_errors("data.train_files", "x.parquet", rows, Chars(), max_prompt_length=4, need=2)
['data.train_files: x.parquet: only 1 of 2 prompts fit data.max_prompt_length=4 tokens (1 longer), fewer than \
the 2 a batch needs (got 1). Raise data.max_prompt_length, lower data.train_batch_size, or add prompts.']
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rlhf_mcore.data.dataset import tokenize_row


def fit_errors(key: str, source: str, rows: Sequence[tuple[str, object]], tokenizer, max_prompt_length: int,
               need: int, filter_overlong: bool = True, what: str = "a batch", tools: Sequence[dict] = (),
               processor=None) -> list[str]:
    """One line when `rows` ((path, validated PromptRow) of the files `source` names) cannot give `need` prompts
    of at most `max_prompt_length` tokens, or when a prompt tokenises to nothing or (without `filter_overlong`)
    is too long. `tools`: the function schemas the loader renders into every prompt (multi-turn), counted too;
    `processor`: a vision model's (`vision_prompt.VisionProcessor`), whose image tokens count too."""
    if not rows:
        return [f"{key}: {source}: no rows (got 0). Point it at a file with prompts."]
    fit = longer = 0
    for path, row in rows:
        try:
            ids = tokenize_row(tokenizer, row, f"{key}: {path}: row {row.index}", tools, processor,
                               Path(path).parent).prompt_ids
        except ValueError as e:  # an image that does not open, images for a text model: the loader's own line
            if row.images:
                return [str(e)]
            return [f"{key}: {path}: row {row.index}: the chat template or tokenizer fails on this prompt "
                    f"({type(e).__name__}: {str(e)[:200]}). Fix the row or the tokenizer."]
        except Exception as e:  # noqa: BLE001 - a template or tokenizer failure on this row: one line
            return [f"{key}: {path}: row {row.index}: the chat template or tokenizer fails on this prompt "
                    f"({type(e).__name__}: {str(e)[:200]}). Fix the row or the tokenizer."]
        if not ids:
            return [f"{key}: {path}: row {row.index}: the prompt tokenises to zero tokens (got {row.messages!r:.80}). "
                    "Fix the row or drop it."]
        if len(ids) > max_prompt_length:
            if not filter_overlong:
                return [f"{key}: {path}: row {row.index}: the prompt has {len(ids)} tokens, more than "
                        f"data.max_prompt_length={max_prompt_length} (got {len(ids)}). Raise data.max_prompt_length "
                        "or set data.filter_overlong_prompts=true."]
            longer += 1
            continue
        fit += 1
        if fit >= need and filter_overlong:
            return []
    if fit >= need:
        return []
    schemas = f" with the {len(tools)} tool schema(s) rendered into each" if tools else ""
    return [f"{key}: {source}: only {fit} of {len(rows)} prompts fit data.max_prompt_length={max_prompt_length} "
            f"tokens ({longer} longer{schemas}), fewer than the {need} {what} needs (got {fit}). Raise "
            f"data.max_prompt_length, {'lower data.train_batch_size, ' if need > 1 else ''}or add prompts."]
