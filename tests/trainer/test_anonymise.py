"""Catalog ids anonymised per state: one random catalog id for each id a state shows, the same throughout
its prompt, its response and its screen-id choices; drawn from torch's generator, so a seed repeats them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.extractors.tinylake import ITEM
from tests.trainer.test_optd import train_settings
from tests.trainer.test_screen_ids import IDS, lake, records  # noqa: F401 - module fixtures
from trainer import run as run_module
from trainer.anonymise import anonymised, id_token_table
from trainer.data import encode
from trainer.models import train_tokenizer
from trainer.run import run_sft
from trainer.sft import IdNotOneToken, screen_id_batch
from transforms.click_line import listed_click_ids

#: a catalog larger than the four ids the records show, so a map has ids to choose among
CATALOG = IDS + [f"i_{n:016x}" for n in range(1, 29)]


@pytest.fixture(scope="module")
def tokenizer(records):  # noqa: F811 - the screen-id records, a catalog of 32 single-token ids
    return train_tokenizer([t for r in records for t in (r.system, r.prompt, r.response)], 400, CATALOG)


@pytest.fixture(scope="module")
def states(records, tokenizer):  # noqa: F811
    return encode(records, tokenizer, 10_000, 10_000)[0]


def token_of(tokenizer, item_id: str) -> int:
    return tokenizer.convert_tokens_to_ids(item_id)


def test_each_id_becomes_one_catalog_id_throughout_its_state(states, tokenizer):
    table = id_token_table(tokenizer, CATALOG)
    catalog = {token_of(tokenizer, i) for i in CATALOG}
    assert set(table.tolist()) == catalog
    torch.manual_seed(0)
    for state in states:
        shown = anonymised(state, table)
        before, after = state.prompt_ids + state.response_ids, shown.prompt_ids + shown.response_ids
        present = {t for t in before if t in catalog}
        # every id the state shows has its own stand-in from the catalog, two ids never one stand-in
        assert set(shown.id_map) == present and len(set(shown.id_map.values())) == len(present)
        assert set(shown.id_map.values()) <= catalog
        # each token in place: an id replaced by its stand-in wherever it stands, every other token kept
        assert len(after) == len(before)
        assert after == [shown.id_map.get(t, t) for t in before]
        assert len(shown.response_ids) == len(state.response_ids) and shown.record is state.record


def test_a_seed_repeats_the_maps_and_another_seed_draws_others(states, tokenizer):
    table = id_token_table(tokenizer, CATALOG)

    def maps(seed: int) -> list[dict[int, int]]:
        torch.manual_seed(seed)
        return [anonymised(state, table).id_map for state in states]

    # 16 states of two ids each among 32: another seed drawing the same 16 maps is all but impossible
    assert maps(7) == maps(7)
    assert maps(7) != maps(8)


def test_the_screen_id_choices_are_the_stand_ins_of_the_listed_ids(states, tokenizer):
    table = id_token_table(tokenizer, CATALOG)
    torch.manual_seed(1)
    shown = [anonymised(state, table) for state in states]
    batch = screen_id_batch(shown, tokenizer, None)
    assert batch is not None
    for row, state in enumerate(shown):
        listed = [state.id_map[token_of(tokenizer, i)] for i in listed_click_ids(state.record.prompt)]
        assert batch.choices[row, : len(listed)].tolist() == listed
        # the choices are ids the anonymised prompt itself shows, not those of the record's text
        assert set(listed) <= set(batch.input_ids[row].tolist())


def test_an_id_of_several_tokens_or_an_empty_catalog_is_one_clear_error(records):  # noqa: F811
    plain = train_tokenizer([t for r in records for t in (r.system, r.prompt, r.response)], 400)
    with pytest.raises(IdNotOneToken, match=r"tiny\.item_id_tokens"):
        id_token_table(plain, IDS)
    with pytest.raises(ValueError, match="catalog with items"):
        id_token_table(plain, [])


def test_a_run_anonymises_every_state_it_trains_on_with_the_lakes_catalog(tiny_lake, tmp_path, monkeypatch):
    seen: list[tuple[int, ...]] = []

    def spied(state, id_tokens):
        seen.append(tuple(id_tokens.tolist()))
        return anonymised(state, id_tokens)

    monkeypatch.setattr(run_module, "anonymised", spied)
    settings = train_settings(steps=2, states_per_update=3, anonymise_item_ids=True,
                              tiny={"vocab_size": 400, "item_id_tokens": True})  # fmt: skip
    run_sft(settings, tiny_lake, tmp_path / "run", progress=False)
    # two updates of three states each, every one anonymised with the lake's catalog ids as tokens
    assert len(seen) == 6 and len(set(seen)) == 1 and len(seen[0]) == len(set(ITEM.values()))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2]


def test_a_run_without_the_setting_anonymises_nothing(tiny_lake, tmp_path, monkeypatch):
    monkeypatch.setattr(run_module, "anonymised", lambda *_: pytest.fail("anonymised without the setting"))
    run_sft(train_settings(steps=1, tiny={"vocab_size": 400}), tiny_lake, tmp_path / "run", progress=False)


def test_a_resumed_run_anonymises_as_the_uninterrupted_one_does(tiny_lake, tmp_path, monkeypatch):
    maps: dict[str, list[dict[int, int]]] = {"whole": [], "parts": []}
    run = ["whole"]

    def spied(state, id_tokens):
        shown = anonymised(state, id_tokens)
        maps[run[0]].append(shown.id_map)
        return shown

    monkeypatch.setattr(run_module, "anonymised", spied)
    settings = train_settings(steps=4, states_per_update=3, checkpoint_every=2, anonymise_item_ids=True,
                              tiny={"vocab_size": 400, "item_id_tokens": True})  # fmt: skip
    whole = run_sft(settings, tiny_lake, tmp_path / "whole", progress=False)
    run[0] = "parts"
    run_sft(settings, tiny_lake, tmp_path / "parts", stop_after=2, progress=False)
    rest = run_sft(settings, tiny_lake, tmp_path / "parts", resume=True, progress=False)
    # the generator a checkpoint saves draws the same maps after the restart, and the same weights follow
    assert any(maps["whole"]) and maps["parts"] == maps["whole"]
    a = load_file(Path(whole.checkpoint) / "model.safetensors")
    b = load_file(Path(rest.checkpoint) / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
