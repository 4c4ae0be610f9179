"""Prompt datasets: verl-schema parquet, validated and chat-templated into token ids, overlong prompts dropped.

>>> class CharTokenizer:  # any object with encode/apply_chat_template works
...     def apply_chat_template(self, messages, add_generation_prompt=True):
...         return "".join(m["content"] for m in messages) + ">"
...     def encode(self, text):
...         return [ord(c) for c in text]
>>> rows = [{"data_source": "math", "prompt": [{"role": "user", "content": q}],
...          "reward_model": {"ground_truth": "1"}} for q in ("1-0?", "a much longer question?")]
>>> ds = build_prompt_dataset(rows, CharTokenizer(), max_prompt_length=8, source="demo")
>>> len(ds), ds.num_filtered, ds[0].prompt_ids, ds.data_sources
(1, 1, (49, 45, 48, 63, 62), ['math'])
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from rlhf_mcore.data.images import open_images, resolve_path
from rlhf_mcore.data.io import read_parquet_rows
from rlhf_mcore.data.schema import PromptRow, check_row

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PromptDataset:
    rows: tuple[PromptRow, ...]  # kept rows, in file order, with prompt_ids filled in
    num_filtered: int  # rows dropped because their prompt is longer than max_prompt_length tokens
    max_prompt_length: int
    source: str  # file name(s), for messages

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> PromptRow:
        return self.rows[i]

    @property
    def data_sources(self) -> list[str]:
        """The distinct data_source names (check them against the reward registry at start-up)."""
        return sorted({r.data_source for r in self.rows})


def tokenize_prompt(tokenizer, messages: Sequence[dict], tools: Sequence[dict] = ()) -> list[int]:
    """Prompt token ids: the chat template with a generation prompt, encoded without extra special tokens;
    with `tools` (function schemas, multi-turn rollouts) the template renders them (`rlhf_mcore.chat`)."""
    if tools:
        from rlhf_mcore.chat import render_prompt

        return tokenizer.encode(render_prompt(tokenizer, messages, tools))
    return tokenizer.encode(tokenizer.apply_chat_template(list(messages), add_generation_prompt=True))


def tokenize_row(tokenizer, row: PromptRow, where: str, tools: Sequence[dict] = (), processor=None,
                 base_dir: str | Path | None = None) -> PromptRow:
    """The row with its prompt ids; a row with images also gets its image tokens expanded and its grids (through
    `processor`, a `vision_prompt.VisionProcessor`), its image paths resolved. A row with images for a text model
    (no processor) is one error."""
    if not row.images:
        return row.with_ids(tokenize_prompt(tokenizer, row.messages, tools))
    if processor is None:
        raise ValueError(f"{where}: images: the row has {len(row.images)} image(s) but the model is text-only. "
                         "Use a vision-language model (Qwen2.5-VL) or drop the images column.")
    images = open_images(row.images, where, base_dir)
    ids, grids = processor.prompt_ids(tokenizer, row.messages, images,
                                      lambda tok, messages: tokenize_prompt(tok, messages, tools))
    paths = tuple(s if isinstance(s, bytes) else str(resolve_path(s, base_dir)) for s in row.images)
    return row.with_ids(ids, grids, paths)


def build_prompt_dataset(
    records: Sequence[dict],
    tokenizer,
    max_prompt_length: int,
    *,
    source: str,
    filter_overlong: bool = True,
    tools: Sequence[dict] = (),
    processor=None,
) -> PromptDataset:
    """Validate, tokenise and length-filter raw rows (from one or more files; ``source`` names them).

    With ``filter_overlong=False`` an overlong prompt raises instead of being dropped (never truncated). Rows
    with images need `processor` (`vision_prompt.VisionProcessor`); their image paths may be relative to
    ``source``'s directory.
    """
    if max_prompt_length <= 0:
        raise ValueError(f"max_prompt_length must be positive (got {max_prompt_length})")
    kept, num_filtered = [], 0
    for i, record in enumerate(records):
        where = f"{source}: row {i}"
        row = tokenize_row(tokenizer, check_row(record, where, i), where, tools, processor, Path(source).parent)
        ids = row.prompt_ids
        if not ids:
            raise ValueError(f"{where}: prompt tokenises to zero tokens")
        if len(ids) > max_prompt_length:
            if not filter_overlong:
                raise ValueError(
                    f"{where}: prompt has {len(ids)} tokens > max_prompt_length={max_prompt_length}. "
                    "Raise data.max_prompt_length or set data.filter_overlong_prompts=true."
                )
            num_filtered += 1
            continue
        kept.append(row)
    if not kept:
        raise ValueError(
            f"{source}: no prompts left ({len(records)} rows, {num_filtered} longer than "
            f"max_prompt_length={max_prompt_length} tokens). Raise data.max_prompt_length."
        )
    if num_filtered:
        logger.warning(
            "%s: dropped %d of %d prompts longer than %d tokens", source, num_filtered, len(records),
            max_prompt_length,
        )
    logger.info("%s: %d prompts", source, len(kept))
    return PromptDataset(tuple(kept), num_filtered, max_prompt_length, source)


def load_prompt_dataset(
    paths: str | Path | Sequence[str | Path],
    tokenizer,
    max_prompt_length: int,
    *,
    filter_overlong: bool = True,
    tools: Sequence[dict] = (),
    processor=None,
) -> PromptDataset:
    """Load one or more verl-schema parquet files as a single PromptDataset.

    Row indices in error messages count from 0 within each file.
    """
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise ValueError("load_prompt_dataset: no files given")
    rows: list[PromptRow] = []
    num_filtered = 0
    for path in paths:
        part = build_prompt_dataset(
            read_parquet_rows(path), tokenizer, max_prompt_length, source=str(path),
            filter_overlong=filter_overlong, tools=tools, processor=processor,
        )
        rows.extend(part.rows)
        num_filtered += part.num_filtered
    return PromptDataset(tuple(rows), num_filtered, max_prompt_length, ",".join(str(p) for p in paths))
