"""robotd.recent.Recent: the bounded memory wire ids are checked against."""

from __future__ import annotations

import pytest

from robotd.recent import Recent


def test_the_oldest_key_is_forgotten_first_and_a_key_added_again_keeps_its_age() -> None:
    r: Recent[int, str] = Recent(3)
    for key in (1, 2, 3):
        r.add(key, f"v{key}")
    r.add(1, "again")  # remembered already: first value, first age
    r.add(4, "v4")
    assert 1 not in r and [k in r for k in (2, 3, 4)] == [True, True, True]
    assert r.get(2) == "v2" and r.get(1) is None and len(r) == 3


def test_pop_forgets_and_says_what_was_kept() -> None:
    r: Recent[int, str] = Recent(2)
    r.add(7, "w")
    assert r.pop(7) == "w" and r.pop(7) is None and 7 not in r


def test_a_million_keys_keep_it_bounded() -> None:
    r: Recent[int, None] = Recent(1024)
    for key in range(10**6):
        r.add(key, None)
    assert len(r) == 1024 and (10**6 - 1) in r and 0 not in r


def test_it_must_keep_something() -> None:
    with pytest.raises(ValueError, match="keep must be >= 1"):
        Recent(0)
