"""The states a run tokenized, kept beside it so the next stage reuses them (``OUT/prepared.parquet``).

OPTD starts from the SFT run's tokenizer; the states the SFT run drew, its held-out states
among them, are read back instead of tokenized again. A file written with another tokenizer
is ignored (its fingerprint is in the file's metadata).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from transformers import PreTrainedTokenizerBase

from trainer.data import StatePool
from trainer.models import tokenizer_fingerprint
from transforms.files import atomic_file

PREPARED_FILE = "prepared.parquet"
FINGERPRINT_KEY = b"tokenizer_fingerprint"
SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("privileged_prompt_ids", pa.list_(pa.int32())),
        ("with_intent", pa.bool_()),
    ]
)


def save_prepared(path: Path, pool: StatePool, tokenizer: PreTrainedTokenizerBase) -> int:
    """Write the pool's tokenized states (those kept); returns how many."""
    rows = []
    for _, state in sorted(pool.encoded.items()):
        if state is None:
            continue
        rows.append(
            {
                "key": state.record.key,
                "prompt_ids": state.prompt_ids,
                "response_ids": state.response_ids,
                "privileged_prompt_ids": pool.privileged_ids.get(state.record.key),
                "with_intent": state.record.key in pool.with_intent,
            }
        )
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    table = table.replace_schema_metadata({FINGERPRINT_KEY: tokenizer_fingerprint(tokenizer).encode()})
    with atomic_file(path) as temporary:
        pq.write_table(table, temporary)
    return len(rows)


def load_prepared(path: Path, pool: StatePool, tokenizer: PreTrainedTokenizerBase) -> int:
    """Offer ``pool`` the states of ``path`` tokenized as the pool would; returns how many were offered.

    A state's ids are reused when its prompt was rendered the way this pool renders it (an SFT state
    trained with the intent in its prompt has another prompt); a privileged prompt an earlier run did
    not need is tokenized when the state is drawn.
    """
    if not path.is_file():
        return 0
    table = pq.read_table(path)
    fingerprint = (table.schema.metadata or {}).get(FINGERPRINT_KEY, b"").decode()
    if fingerprint != tokenizer_fingerprint(tokenizer):
        return 0
    keys = {record.key for record in pool.records}
    offered = 0
    for row in table.to_pylist():
        key = row["key"]
        if key not in keys or row["with_intent"] != (key in pool.with_intent):
            continue
        pool.reuse(key, row["prompt_ids"], row["response_ids"], row["privileged_prompt_ids"])
        offered += 1
    return offered
