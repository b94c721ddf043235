import pytest

from mvsink.mint import Description, Minter


def test_first_description_starts_at_as_of_and_covers_desired():
    m = Minter(as_of=5, read_only=False)
    m.advance_desired(9)
    assert m.maybe_mint() == Description(5, 9)


def test_nothing_until_desired_is_past_the_shard_upper():
    m = Minter(as_of=5, read_only=False)
    m.advance_desired(5)
    assert m.maybe_mint() is None
    m.advance_desired(6)
    assert m.maybe_mint() == Description(5, 6)


def test_no_new_description_until_the_shard_advanced():
    m = Minter(as_of=0, read_only=False)
    m.advance_desired(3)
    assert m.maybe_mint() == Description(0, 3)
    m.advance_desired(7)
    assert m.maybe_mint() is None, "the last description is still in flight"
    m.advance_persist(3)
    assert m.maybe_mint() == Description(3, 7)


def test_lowers_strictly_increase_and_uppers_never_decrease():
    m = Minter(as_of=0, read_only=False)
    minted = []
    for desired, persist in [(2, 0), (4, 0), (4, 2), (9, 2), (9, 9), (12, 5), (15, 9), (15, 12)]:
        m.advance_desired(desired)
        m.advance_persist(persist)
        desc = m.maybe_mint()
        if desc:
            minted.append(desc)
    lowers = [d.lower for d in minted]
    uppers = [d.upper for d in minted]
    assert lowers == sorted(set(lowers))
    assert uppers == sorted(uppers)
    assert minted == [Description(0, 2), Description(2, 4), Description(9, 12), Description(12, 15)]


def test_frontiers_never_go_back():
    m = Minter(as_of=0, read_only=False)
    m.advance_desired(10)
    m.advance_desired(4)
    m.advance_persist(6)
    m.advance_persist(2)
    assert m.maybe_mint() == Description(6, 10)


def test_read_only_mints_nothing_until_allowed_and_never_goes_back():
    m = Minter(as_of=0, read_only=True)
    m.advance_desired(5)
    assert m.maybe_mint() is None
    m.advance_persist(3)
    assert m.maybe_mint() is None
    m.allow_writes()
    assert m.maybe_mint() == Description(3, 5)
    assert not m.read_only


def test_abandoned_description_can_be_minted_again():
    m = Minter(as_of=0, read_only=False)
    m.advance_desired(4)
    desc = m.maybe_mint()
    assert m.maybe_mint() is None
    m.abandon(desc)
    assert m.maybe_mint() == desc


def test_empty_description_is_rejected():
    with pytest.raises(ValueError):
        Description(3, 3)
