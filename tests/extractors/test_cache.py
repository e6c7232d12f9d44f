"""The response cache: append-only segments, an index rebuilt from disk, torn lines skipped."""

from __future__ import annotations

import shutil

from extractors.cache import CachedAnswer, ResponseCache, cache_key

KEY = cache_key({"model": "m"}, "hash", [{"role": "user", "content": "hi"}], "rationale")
ANSWER = CachedAnswer('{"rationale": "Looks right."}', 12, 5, "m")


def test_answers_survive_a_new_process(tmp_path):
    first = ResponseCache(tmp_path)
    first.put(KEY, ANSWER)
    first.close()
    again = ResponseCache(tmp_path)  # what a later run (another process) sees: the index is read from disk
    assert again.get(KEY) == ANSWER and len(again) == 1


def test_key_covers_every_part():
    base = ({"model": "m"}, "hash", [{"role": "user", "content": "hi"}], "rationale")
    variants = [
        ({"model": "other"}, *base[1:]),
        (base[0], "hash2", *base[2:]),
        (*base[:2], [{"role": "user", "content": "hi!"}], base[3]),
        (*base[:3], "intent"),
    ]
    assert len({cache_key(*base), *(cache_key(*v) for v in variants)}) == 5


def test_torn_last_line_is_skipped(tmp_path):
    cache = ResponseCache(tmp_path)
    cache.put(KEY, ANSWER)
    cache.close()
    (segment,) = tmp_path.glob("seg-*.jsonl")
    with segment.open("ab") as f:  # a crash in the middle of the next write
        f.write(b'{"key":"' + b"a" * 64 + b'","text":"half')
    reloaded = ResponseCache(tmp_path)
    assert len(reloaded) == 1 and reloaded.get(KEY) == ANSWER and reloaded.get("a" * 64) is None


def test_shared_instance_is_rebuilt_when_files_vanish(tmp_path):
    lake = tmp_path / "lake"
    shared = ResponseCache.in_lake(lake)
    shared.put(KEY, ANSWER)
    shared.close()
    assert ResponseCache.in_lake(lake) is shared and KEY in shared
    shutil.rmtree(lake / "_cache")  # someone cleared the cache: the index must not outlive it
    assert KEY not in ResponseCache.in_lake(lake)


def test_spend_adds_up_every_paid_answer_across_processes(tmp_path):
    first = ResponseCache(tmp_path)
    first.put(KEY, CachedAnswer('{"rationale": "cost_usd\\":9 in the text"}', 12, 5, "m", 0.25))
    first.close()
    second = ResponseCache(tmp_path)  # another run: its own segment
    other = cache_key({"model": "m"}, "hash", [{"role": "user", "content": "again"}], "rationale")
    second.put(other, CachedAnswer("{}", 3, 2, "m", 0.5))
    second.close()
    # 0.25 + 0.5 from disk; the text's look-alike of the field is escaped, never counted
    assert ResponseCache(tmp_path).spent_usd == 0.75
    assert ResponseCache(tmp_path).get(KEY).cost_usd == 0.25


def test_answers_written_before_costs_were_kept_count_zero(tmp_path):
    tmp_path.joinpath("seg-1-1.jsonl").write_text(
        '{"key":"' + KEY + '","text":"{}","tokens_in":1,"tokens_out":1,"model":"m"}\n'
    )
    cache = ResponseCache(tmp_path)
    assert cache.spent_usd == 0.0 and cache.get(KEY) == CachedAnswer("{}", 1, 1, "m")
