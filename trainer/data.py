"""Training states: the lake's records, tokenized with the model's chat template when first used.

A state is one record: prompt ids (system + user turns, generation prompt added) and
response ids (the gold JSON, then eos). Records without a gold response are skipped
and counted. A state longer than the configured limits is dropped and counted, never
cut: cutting the start of the prompt would cut the profile and history the simulator
is conditioned on, and cutting the response would teach it to stop mid-JSON.

A run tokenizes only the states it draws (``StatePool``), its held-out states and its probe
states: the pool holds every record's text, and the sampler draws indices into it.

Held-out states are one per session of the held-out users' split, the sessions in a fixed
order (a hash of the session id), so every run on a lake scores the same states whatever its
seed or stage: the SFT and OPTD curves compare.

Reads with pyarrow, tokenizes with transformers: no polars at import time.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import torch
from transformers import PreTrainedTokenizerBase

COLUMNS = [
    "record_id",
    "session_id",
    "user_id",
    "mode",
    "system",
    "prompt",
    "response",
    "action",
    "intent",
    "split",
]
GOLD_MISSING = "gold_missing"  # the records stage's reason code for a null gold response, where it writes one
INTENT_HEADING = "## Your intent over this whole trajectory"


@dataclass(frozen=True)
class RecordText:
    """The texts of one record a trainer needs (``key`` = ``mode/record_id``, unique in the table)."""

    key: str
    system: str
    prompt: str
    response: str
    action: str
    intent: str | None
    split: str
    session_id: str | None = None
    user_id: str | None = None

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.prompt}]

    def privileged_messages(self) -> list[dict[str, str]]:
        """The messages with the trajectory intent z_u appended to the user turn (the teacher's view)."""
        if not self.intent:
            raise ValueError(f"{self.key} has no intent: it has no privileged prompt")
        user = f"{self.prompt}\n\n{INTENT_HEADING}\n{self.intent}"
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]

    @property
    def record_id(self) -> str:
        """The records table's ``record_id`` (the key is ``mode/record_id``)."""
        return self.key.split("/", 1)[1] if "/" in self.key else self.key


@dataclass(frozen=True)
class EncodedState:
    record: RecordText
    prompt_ids: list[int]
    response_ids: list[int]  # ends with eos
    # where the state's item ids were anonymised: each id token of the record's text -> the one it shows
    id_map: dict[int, int] = field(default_factory=dict)


def load_records(
    lake: str | Path, splits: Sequence[str], modes: Sequence[str]
) -> tuple[list[RecordText], Counter[str]]:
    """Records of ``splits`` and ``modes`` sorted by key, and those without a gold response counted by
    reason (the table's ``gold_missing`` code, else ``no_gold_response``)."""
    folder = Path(lake) / "records"
    if not folder.exists():
        raise FileNotFoundError(f"no records table under {lake}: run the records stage first")
    dataset = ds.dataset(folder, format="parquet", partitioning="hive")
    missing = [c for c in COLUMNS if c not in dataset.schema.names]
    if missing:
        raise ValueError(f"the records table under {lake} lacks the columns {', '.join(missing)}")
    wanted = pc.field("split").isin(list(splits)) & pc.field("mode").isin(list(modes))
    why_missing = [GOLD_MISSING] if GOLD_MISSING in dataset.schema.names else []
    rows = dataset.to_table(columns=COLUMNS + why_missing, filter=wanted).to_pylist()
    skipped: Counter[str] = Counter()
    records = []
    for row in rows:
        if not (row["response"] or "").strip():
            skipped[row.get(GOLD_MISSING) or "no_gold_response"] += 1
            continue
        records.append(
            RecordText(
                key=f"{row['mode']}/{row['record_id']}",
                system=row["system"],
                prompt=row["prompt"],
                response=row["response"],
                action=row["action"],
                intent=row["intent"],
                split=row["split"],
                session_id=row["session_id"],
                user_id=row["user_id"],
            )
        )
    records.sort(key=lambda r: r.key)
    return records, skipped


def prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[int]:
    """The chat template's ids for ``messages`` with the assistant's generation prompt appended."""
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(encoded["input_ids"])


def response_ids(tokenizer: PreTrainedTokenizerBase, response: str) -> list[int]:
    return [*tokenizer(response, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]


def length_problem(state: EncodedState, max_prompt_tokens: int, max_response_tokens: int) -> str | None:
    """Why a state is too long to train on (``prompt_too_long``, ``response_too_long``), or None."""
    if len(state.prompt_ids) > max_prompt_tokens:
        return "prompt_too_long"
    if len(state.response_ids) > max_response_tokens:
        return "response_too_long"
    return None


def encode(
    records: Sequence[RecordText],
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_tokens: int,
    max_response_tokens: int,
) -> tuple[list[EncodedState], Counter[str]]:
    """Tokenized states, and the count of those dropped for length (``prompt_too_long``, ...)."""
    dropped: Counter[str] = Counter()
    states = []
    for record in records:
        state = EncodedState(
            record, prompt_ids(tokenizer, record.messages()), response_ids(tokenizer, record.response)
        )
        problem = length_problem(state, max_prompt_tokens, max_response_tokens)
        if problem:
            dropped[problem] += 1
        else:
            states.append(state)
    return states, dropped


# --- choosing states -----------------------------------------------------------------------------


def _stable_rank(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def spread_over_sessions(records: Sequence[RecordText], n: int) -> list[RecordText]:
    """``n`` records, one per session (a second round when there are fewer sessions), the sessions in
    the order of a hash of their ids and each session's record chosen by a hash of its key: a fixed
    choice that depends on the records alone, never on a run's seed."""
    by_session: dict[str, list[RecordText]] = {}
    for record in records:
        by_session.setdefault(record.session_id or record.key, []).append(record)
    rounds = [
        sorted(group, key=lambda r: _stable_rank(r.key))
        for _, group in sorted(by_session.items(), key=lambda item: _stable_rank(item[0]))
    ]
    chosen: list[RecordText] = []
    depth = 0
    while len(chosen) < n and any(depth < len(group) for group in rounds):
        chosen += [group[depth] for group in rounds if depth < len(group)][: n - len(chosen)]
        depth += 1
    return chosen


def check_users_apart(trained: Iterable[RecordText], held_out: Iterable[RecordText]) -> None:
    """Refuse held-out states of a user the run trains on: held out means a user never trained on."""
    shared = {r.user_id for r in trained} & {r.user_id for r in held_out}
    shared.discard(None)
    if shared:
        example = sorted(shared)[0]
        raise ValueError(
            f"{len(shared)} users (e.g. {example}) have states in both the training and the held-out "
            "split: held-out figures would not be held out"
        )


# --- the pool of training states -------------------------------------------------------------------


class StatePool:
    """The training records, each tokenized on first use and kept (prepare only the states drawn).

    ``privileged``: also tokenize each state's privileged prompt (OPTD's teacher context); a
    state whose privileged prompt is over the limit is dropped like a long plain prompt.
    ``with_intent``: the keys whose SFT prompt carries the intent (a teacher that learns to read one).
    ``reuse`` seeds the token ids of earlier runs (``trainer.prepared``), which are then not
    tokenized again.
    """

    def __init__(
        self,
        records: Sequence[RecordText],
        tokenizer: PreTrainedTokenizerBase,
        max_prompt_tokens: int,
        max_response_tokens: int,
        privileged: bool = False,
        with_intent: frozenset[str] = frozenset(),
    ) -> None:
        self.records, self.tokenizer = list(records), tokenizer
        self.limits = max_prompt_tokens, max_response_tokens
        self.privileged, self.with_intent = privileged, with_intent
        self.encoded: dict[int, EncodedState | None] = {}
        self.privileged_ids: dict[str, list[int]] = {}  # by record key
        self.dropped: Counter[str] = Counter()
        self.known: dict[str, tuple[list[int], list[int], list[int] | None]] = {}
        self.reused = 0

    def __len__(self) -> int:
        return len(self.records)

    def reuse(self, key: str, prompt: list[int], response: list[int], privileged: list[int] | None) -> None:
        """Token ids tokenized before with the same tokenizer (``prompt`` as this pool would render it)."""
        self.known[key] = (prompt, response, privileged)

    def get(self, index: int) -> EncodedState | None:
        """The state of record ``index``, or None when it is too long (counted once, by reason)."""
        if index not in self.encoded:
            self.encoded[index] = self._encode(index)
        return self.encoded[index]

    def _encode(self, index: int) -> EncodedState | None:
        record = self.records[index]
        known = self.known.get(record.key)
        if known is not None:
            self.reused += 1
            prompt, response, privileged = known
        else:
            messages = record.privileged_messages() if record.key in self.with_intent else record.messages()
            prompt, response = (
                prompt_ids(self.tokenizer, messages),
                response_ids(self.tokenizer, record.response),
            )
            privileged = None
        state = EncodedState(record, prompt, response)
        problem = length_problem(state, *self.limits)
        if problem is None and self.privileged:
            if privileged is None:
                privileged = prompt_ids(self.tokenizer, record.privileged_messages())
            if len(privileged) > self.limits[0]:
                problem = "privileged_prompt_too_long"
            else:
                self.privileged_ids[record.key] = privileged
        if problem:
            self.dropped[problem] += 1
            return None
        return state

    @property
    def prepared(self) -> int:
        """Records made ready so far (kept or dropped, tokenized here or reused)."""
        return len(self.encoded)


# --- batches ------------------------------------------------------------------------------


@dataclass
class Batch:
    """Right-padded prompt + response ids, and where each response token is predicted.

    The hidden state at ``positions[k]`` of row ``rows[k]`` predicts ``labels[k]``, the
    k-th response token of the batch; ``owner[k]`` is its state's index in the batch.
    """

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    rows: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    labels: torch.Tensor  # [N]
    owner: torch.Tensor  # [N]
    n_states: int

    @property
    def n_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def unscored(self, tokens: torch.Tensor | None) -> Batch:
        """The batch with its response tokens among ``tokens`` read as context but not predicted."""
        if tokens is None:
            return self
        kept = ~torch.isin(self.labels, tokens.to(self.labels.device))
        return Batch(self.input_ids, self.attention_mask, self.rows[kept], self.positions[kept],
                     self.labels[kept], self.owner[kept], self.n_states)  # fmt: skip

    def to(self, device: torch.device) -> Batch:
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()}
        return Batch(**moved)


def collate(states: Sequence[EncodedState], pad_id: int, pad_to: int | None = None) -> Batch:
    """One batch of ``states``; ``pad_to`` pads every row to that length (at least the longest)."""
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in states]
    width = max([*lengths, pad_to or 0])
    input_ids = torch.full((len(states), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(states), width), dtype=torch.long)
    rows, positions, labels, owner = [], [], [], []
    for i, state in enumerate(states):
        ids = state.prompt_ids + state.response_ids
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        start = len(state.prompt_ids)  # first response token; predicted by the position before it
        n = len(state.response_ids)
        rows.append(torch.full((n,), i))
        positions.append(torch.arange(start - 1, start - 1 + n))
        labels.append(torch.tensor(state.response_ids))
        owner.append(torch.full((n,), i))
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        rows=torch.cat(rows),
        positions=torch.cat(positions),
        labels=torch.cat(labels),
        owner=torch.cat(owner),
        n_states=len(states),
    )


# --- sampling -----------------------------------------------------------------------------


def power_law_weights(actions: Sequence[str], alpha: float) -> torch.Tensor:
    """Per-state sampling weights giving class probabilities q_i = n_i^alpha / sum_j n_j^alpha.

    Each of the n_i states of class i gets n_i^(alpha - 1), so the class as a whole gets
    n_i^alpha (RecVerse's smoothing of a long-tailed action mix; alpha = 1 is uniform
    over states, alpha = 0 uniform over classes).
    """
    counts = Counter(actions)
    return torch.tensor([counts[a] ** (alpha - 1.0) for a in actions], dtype=torch.float64)


class StateSampler:
    """Deterministic stream of state indices: epoch e is a permutation (or weighted draw) seeded by (seed, e).

    Its whole position is the number of indices drawn so far, so a checkpoint stores one integer.
    """

    def __init__(self, n_states: int, seed: int, weights: torch.Tensor | None = None) -> None:
        if n_states <= 0:
            raise ValueError("no training states to sample from")
        self.n_states, self.seed, self.weights = n_states, seed, weights
        self.drawn = 0
        self._cached: tuple[int, torch.Tensor] = (-1, torch.empty(0, dtype=torch.long))

    def epoch_order(self, epoch: int) -> torch.Tensor:
        if self._cached[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            if self.weights is None:
                order = torch.randperm(self.n_states, generator=generator)
            else:
                order = torch.multinomial(self.weights, self.n_states, replacement=True, generator=generator)
            self._cached = (epoch, order)
        return self._cached[1]

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            epoch, offset = divmod(self.drawn, self.n_states)
            chunk = self.epoch_order(epoch)[offset : offset + k - len(out)].tolist()
            out += chunk
            self.drawn += len(chunk)
        return out

    def state_dict(self) -> dict[str, int]:
        return {"drawn": self.drawn, "n_states": self.n_states, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if (state["n_states"], state["seed"]) != (self.n_states, self.seed):
            raise ValueError(f"sampler state is for {state}, not {self.state_dict()}")
        self.drawn = state["drawn"]


def data_hash(records: Sequence[RecordText], tokenizer_fingerprint: str) -> str:
    """Hash of what a run may train on: keys, system, prompt, response texts in order, and the tokenizer."""
    digest = hashlib.sha256(tokenizer_fingerprint.encode())
    for r in records:
        for part in (r.key, r.system, r.prompt, r.response):
            digest.update(part.encode())
            digest.update(b"\x00")
    return digest.hexdigest()


# what makes a records row the lake's own: which recorded step of which shopper, in which split
RECORD_IDENTITY = ["mode", "record_id", "split", "user_id", "session_id", "action"]


def records_hash(lake: str | Path) -> str:
    """sha256 over which recorded steps the lake's records table holds: every row's mode, record id,
    split, user, session and action, in key order.

    How the rows are rendered (prompts, the rationales in responses) and their intents do not enter
    it: the same lake re-rendered or re-extracted keeps its hash, while another lake, another split
    of the users, or records rebuilt from other logs change it. Every split and mode is hashed, so
    runs on one lake agree whatever their own splits and modes."""
    dataset = ds.dataset(Path(lake) / "records", format="parquet", partitioning="hive")
    table = dataset.to_table(columns=RECORD_IDENTITY).sort_by(
        [("mode", "ascending"), ("record_id", "ascending")]
    )
    # each row's fields joined by NUL (a missing one empty), every row ended by \x01, hashed as one text
    fields = [pc.fill_null(pc.cast(table.column(name), pa.string()), "") for name in RECORD_IDENTITY]
    rows = pc.binary_join_element_wise(*fields, "\x00").to_pylist()
    return hashlib.sha256(("\x01".join(rows) + "\x01").encode()).hexdigest()


def intents_hash(records: Sequence[RecordText]) -> str:
    """Hash of the intents the records carry, in order (what OPTD's teacher is shown)."""
    digest = hashlib.sha256()
    for r in records:
        digest.update(f"{r.key}\x00{r.intent or ''}\x00".encode())
    return digest.hexdigest()
