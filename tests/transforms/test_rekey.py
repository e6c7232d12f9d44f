"""Pseudonyms against Python's own SHA-256, on every column shape the lake has."""

from __future__ import annotations

import hashlib

import polars as pl

from transforms.rekey import Pseudonymizer, bucket_of, split_of


def reference(key: str, kind: str, prefix: str, raw: str) -> str:
    """AMAC-SHA256: the key fills the first block, the output is truncated to 64 bits."""
    secret = key.encode()
    block = (hashlib.sha256(secret).digest() if len(secret) > 64 else secret) + bytes(64)
    return f"{prefix}_" + hashlib.sha256(block[:64] + f"{kind}\x1f{raw}".encode()).hexdigest()[:16]


def test_pseudonyms_are_keyed_sha256_with_the_kind_as_domain():
    keyed = Pseudonymizer("secret").column(pl.Series(["usr-1", "usr-2", None, "usr-1"]), "user")
    assert keyed.to_list() == [
        reference("secret", "user", "u", "usr-1"),
        reference("secret", "user", "u", "usr-2"),
        None,
        reference("secret", "user", "u", "usr-1"),
    ]


def test_a_long_key_is_hashed_to_fit_the_key_block():
    key = "k" * 100  # longer than the 64-byte block
    assert Pseudonymizer(key).column(pl.Series(["x"]), "item")[0] == reference(key, "item", "i", "x")


def test_same_raw_id_differs_across_kinds_and_keys():
    a = Pseudonymizer("one").column(pl.Series(["42"]), "user")[0]
    b = Pseudonymizer("one").column(pl.Series(["42"]), "item")[0]
    c = Pseudonymizer("two").column(pl.Series(["42"]), "user")[0]
    assert len({a[2:], b[2:], c[2:]}) == 3


def test_sorted_columns_and_lists_map_like_plain_ones():
    pseudo = Pseudonymizer("secret")
    runs = pl.Series(["pv-a"] * 6 + ["pv-b"] * 5 + [None] * 3)  # 3 runs over 14 rows: the run path
    assert pseudo.column(runs, "session").to_list() == [
        *[reference("secret", "session", "s", "pv-a")] * 6,
        *[reference("secret", "session", "s", "pv-b")] * 5,
        None, None, None,
    ]  # fmt: skip
    lists = pl.Series([["a", "b"], [], None, ["b"]], dtype=pl.List(pl.String))
    item = lambda raw: reference("secret", "item", "i", raw)  # noqa: E731
    assert pseudo.column(lists, "item").to_list() == [[item("a"), item("b")], [], None, [item("b")]]
    assert pseudo.column(lists.slice(1, 3), "item").to_list() == [[], None, [item("b")]]


def test_images_are_keyed_unless_kept():
    frame = pl.DataFrame({"image": ["img/usr-1/0.jpg"]})
    assert Pseudonymizer("s")(frame)["image"][0] == reference("s", "image", "m", "img/usr-1/0.jpg")
    assert Pseudonymizer("s", keep_image_refs=True)(frame)["image"][0] == "img/usr-1/0.jpg"


def test_split_and_bucket_depend_only_on_the_pseudonym():
    pseudo = Pseudonymizer("s")
    users = pseudo.column(pl.Series([f"usr-{i}" for i in range(2000)]), "user")
    first = split_of(users, 42, (0.8, 0.1, 0.1))
    # appending users changes nobody's split or bucket
    more = pl.concat([users, pseudo.column(pl.Series([f"usr-{i}" for i in range(2000, 3000)]), "user")])
    assert split_of(more, 42, (0.8, 0.1, 0.1)).head(2000).equals(first)
    assert bucket_of(more, 16).head(2000).equals(bucket_of(users, 16))
    assert set(bucket_of(users, 16).to_list()) == set(range(16))
