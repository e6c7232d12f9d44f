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
