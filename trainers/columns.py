"""A prompt dataset's columns and rows checked on its Arrow table (`pyarrow.compute`, never row by row): the prompt
column's format (text or chat), the columns the rewards read, TRL's reserved names, and empty or malformed prompts.
`check_columns` raises one `DatasetError` listing every problem found."""

from __future__ import annotations

import difflib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from grpoflow.core.errors import DatasetError
from grpoflow.trainers.rewards import TRL_ARGUMENTS

MAX_BAD_ROWS = 5


def check_columns(uri: str, table: pa.Table, prompt_column: str, required_columns: dict[str, str] | None) -> str:
    """Returns the prompt format; raises one DatasetError listing every problem found."""
    problems, prompt_format = [], "text"
    if prompt_column not in table.column_names:
        problems.append(_missing_column(prompt_column, f"prompt column '{prompt_column}'", table.column_names))
    elif (prompt_format := _prompt_format(table[prompt_column].type)) is None:
        problems.append(_wrong_type(prompt_column, table[prompt_column].type))
    elif prompt_format == "text":
        problems += _text_prompt_problems(prompt_column, table[prompt_column])
    elif prompt_format == "chat" and (rows := _rows_note(_empty_chat(table[prompt_column]))):
        problems.append(
            f"prompt column '{prompt_column}' holds a null or empty message list, or a message without role or "
            f"content, in {rows}; fill them in or drop them"
        )
    elif prompt_format == "chat" and (rows := _rows_note(_blank_user_message(table[prompt_column]))):
        problems.append(
            f"prompt column '{prompt_column}' has a user message that is empty or only whitespace (no question "
            f"for the model) in {rows}; fill them in or drop them"
        )
    if prompt_format == "chat" and not problems and (rows := _rows_note(_ends_with_assistant(table[prompt_column]))):
        problems.append(
            f"prompt column '{prompt_column}' ends with an assistant message in {rows}: a prompt ends with the turn "
            "the model answers (the user's), as OpenAI's RFT format requires; a trailing assistant message is an "
            "answer: put it in a column of its own (e.g. reference_answer) for the rewards to read"
        )
    reserved = [name for name in table.column_names if name in TRL_ARGUMENTS | TRL_IMAGES and name != prompt_column]
    problems += [_reserved_column(name) for name in reserved]
    for name, reason in (required_columns or {}).items():
        if name == prompt_column:
            continue
        if name not in table.column_names:
            problems.append(_missing_column(name, f"column '{name}' (needed by {reason})", table.column_names))
        elif rows := _rows_note(pc.is_null(table[name])):
            problems.append(f"column '{name}' (needed by {reason}) is null in {rows}; fill them in or drop them")
    each = [f"dataset {uri}: {p}" for p in problems]
    if len(problems) == 1:
        raise DatasetError(each[0])
    if problems:
        listing = "\n".join(f"  - {p}" for p in problems)
        raise DatasetError(f"dataset {uri} has {len(problems)} problems:\n{listing}", each)
    return prompt_format


# The columns GRPOTrainer reads as images (`_generate_and_score_completions`), of a vision-language model.
TRL_IMAGES = frozenset({"image", "images"})


def _reserved_column(name: str) -> str:
    # TRL gives every reward its own `prompts`, `completions`, `completion_ids` (a column of one of these names makes
    # each reward call fail with "got multiple values"), `trainer_state`, `log_extra`, `log_metric` and `environments`
    # (TRL's replace the column's, silently); it reads `image` and `images` as the prompts' images.
    if name in TRL_IMAGES:
        return (
            f"column '{name}' is what TRL reads as the prompts' images (vision-language training, which grpoflow does "
            "not run: the first step would fail after the model loads); rename the column (e.g. image_url) if a "
            "reward reads it"
        )
    what = (
        "TRL would fail at the first step (each reward given two values for it)"
        if name in ("prompts", "completions", "completion_ids")
        else "a reward asking for it gets TRL's, never this column"
    )
    return (
        f"column '{name}' has the name of an argument TRL gives every reward ({', '.join(sorted(TRL_ARGUMENTS))}): "
        f"{what}; rename the column"
    )


def _wrong_type(name: str, t: pa.DataType) -> str:
    # `datasets` stores a field whose JSON type changes between rows as JSON text in an `arrow.json` column.
    mixed = " (its rows mix types, e.g. strings and lists)" if getattr(t, "extension_name", "") == "arrow.json" else ""
    return (
        f"prompt column '{name}' has Arrow type {t}{mixed}; it must hold strings (text prompts) or lists of "
        "{role, content} messages with string fields (chat prompts) in every row"
    )


def _missing_column(name: str, label: str, columns: list[str]) -> str:
    lowered = {c.lower(): c for c in columns}
    close = difflib.get_close_matches(name.lower(), lowered, n=1)
    hint = f"; did you mean '{lowered[close[0]]}'?" if close else ""
    return f"{label} not found; the columns are {', '.join(repr(c) for c in columns)}{hint}"


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _prompt_format(t: pa.DataType) -> str | None:
    if _is_string(t):
        return "text"
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_struct(t.value_type):
        fields = {f.name: f.type for f in t.value_type}
        if all(_is_string(fields.get(name, pa.null())) for name in ("role", "content")):
            return "chat"
    return None


def _text_prompt_problems(name: str, column: pa.ChunkedArray) -> list[str]:
    """Text prompts that are null or empty, and those of whitespace alone (no question for the model either)."""
    problems = []
    if rows := _rows_note(_empty_text(column)):
        problems.append(f"prompt column '{name}' is null or empty in {rows}; fill them in or drop them")
    if rows := _rows_note(pc.fill_null(pc.utf8_is_space(column), False)):  # false for "", true for " \t\n"
        problems.append(f"prompt column '{name}' is only whitespace in {rows}; fill them in or drop them")
    return problems


def _empty_text(column: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.fill_null(pc.equal(pc.binary_length(column), 0), True)


def _empty_chat(column: pa.ChunkedArray) -> pa.ChunkedArray:
    masks = []
    for chunk in column.chunks:
        bad = pc.fill_null(pc.equal(pc.list_value_length(chunk), 0), True)
        messages = chunk.flatten()
        role, content = pc.struct_field(messages, "role"), pc.struct_field(messages, "content")
        bad_message = pc.or_(pc.is_null(messages), pc.or_(pc.is_null(role), pc.is_null(content)))
        bad_rows = pc.filter(pc.list_parent_indices(chunk), bad_message)
        if len(bad_rows):  # rare, so building a row-number array here costs nothing on good data
            bad = pc.or_(bad, pc.is_in(pa.array(range(len(chunk)), pa.int64()), value_set=bad_rows.cast(pa.int64())))
        masks.append(bad)
    return pa.chunked_array(masks, type=pa.bool_())


def _blank_user_message(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Per row: whether one of its user messages is empty or whitespace alone (checked after `_empty_chat`)."""
    masks = []
    for chunk in column.chunks:
        messages = chunk.flatten()
        content = pc.utf8_trim_whitespace(pc.struct_field(messages, "content"))
        blank = pc.and_(pc.equal(pc.struct_field(messages, "role"), "user"), pc.equal(pc.binary_length(content), 0))
        mask = np.zeros(len(chunk), dtype=bool)
        mask[pc.filter(pc.list_parent_indices(chunk), pc.fill_null(blank, False)).to_numpy()] = True
        masks.append(pa.array(mask))
    return pa.chunked_array(masks, type=pa.bool_())


def _ends_with_assistant(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Per row: whether the chat's last message has the role `assistant`."""
    masks = []
    for chunk in column.chunks:
        lengths = pc.fill_null(pc.list_value_length(chunk), 0)
        roles = pc.struct_field(chunk.flatten(), "role")
        offsets = chunk.offsets  # of a sliced chunk, they count from its first value: flatten() starts there
        last = pc.subtract(pc.subtract(offsets[1:], offsets[0]), 1)  # each row's last message's index in `roles`
        kept = pc.greater(lengths, 0)
        is_assistant = pc.equal(pc.take(roles, pc.if_else(kept, last, 0)), "assistant") if len(roles) else kept
        masks.append(pc.fill_null(pc.and_(kept, is_assistant), False))
    return pa.chunked_array(masks, type=pa.bool_())


def _rows_note(mask: pa.ChunkedArray) -> str | None:
    """`"3 rows (rows 2, 5, 9; data rows counted from 1)"`, or None when the mask is all false."""
    indices = pc.indices_nonzero(mask)
    if len(indices) == 0:
        return None
    first = [str(i + 1) for i in indices[:MAX_BAD_ROWS].to_pylist()]
    more = f" and {len(indices) - len(first)} more" if len(indices) > len(first) else ""
    plural = "s" if len(indices) > 1 else ""
    return f"{len(indices)} row{plural} (row{plural} {', '.join(first)}{more}; data rows counted from 1)"
