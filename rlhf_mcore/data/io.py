"""Reading jsonl sources and reading/writing verl-schema parquet, with errors that name file and line/row."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterable, Sequence

from rlhf_mcore.data.schema import REQUIRED_COLUMNS, check_row

PARQUET_MAGIC = b"PAR1"


def read_jsonl(path: str | Path, required_keys: Sequence[str] = ()) -> list[tuple[int, dict]]:
    """``(line_number, object)`` for every non-blank line of a jsonl file (1-based line numbers); a name
    ending in ``.gz`` is read through gzip.

    Raises ValueError naming the file and line for invalid JSON, a non-object line or a missing key.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
    records = []
    with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: invalid JSON ({err.msg} at column {err.colno})") from err
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{line_no}: expected a JSON object (got {type(record).__name__})")
            missing = [k for k in required_keys if k not in record]
            if missing:
                raise ValueError(f"{path}:{line_no}: missing key(s) {missing} (has {sorted(record)})")
            records.append((line_no, record))
    return records


def read_parquet_rows(path: str | Path) -> list[dict]:
    """All rows of a verl-schema parquet file as dicts (columns checked, rows not yet validated)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: file not found. Run tools/prepare_gsm8k.py (or prepare_math.py) first.")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != PARQUET_MAGIC:
        raise ValueError(f"{path}: not a parquet file (it starts with {head!r}, parquet with {PARQUET_MAGIC!r}). "
                         "Write verl-schema parquet, e.g. with rlhf_mcore.data.io.write_prompt_parquet or "
                         "tools/prepare_gsm8k.py; a .jsonl file is not read directly.")
    table = pq.read_table(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing} (has {table.column_names}); expected verl's schema")
    try:
        return table.to_pylist()
    except UnicodeDecodeError as err:
        row, column = first_undecodable(table)
        raise ValueError(f"{path}: row {row}: column {column!r} is not valid UTF-8 ({err.reason}: byte "
                         f"{err.object[err.start:err.start + 1]!r} at position {err.start}). Write the text as UTF-8."
                         ) from err


def first_undecodable(table) -> tuple[int, str]:
    """(row, column) of the first value of `table` whose text is not valid UTF-8 ((-1, "") if none)."""
    for row in range(table.num_rows):
        for column in table.column_names:
            try:
                table.column(column).slice(row, 1).to_pylist()
            except UnicodeDecodeError:
                return row, column
    return -1, ""


def write_prompt_parquet(rows: Iterable[dict], path: str | Path) -> int:
    """Validate every row, then write them as one parquet file; returns the row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = list(rows)
    for i, row in enumerate(rows):
        check_row(row, f"{path}: row {i}", i)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return len(rows)
