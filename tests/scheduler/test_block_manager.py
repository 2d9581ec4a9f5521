"""The block manager's accounting: allocate, grow, free, swap, and the invariants."""

import pytest

from minicb.scheduler.block_manager import BlockManager, blocks_needed


def test_blocks_needed_rounds_up():
    assert [blocks_needed(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_allocate_grows_only_when_a_block_fills():
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.allocate_slots(7, 3) == [0]
    assert bm.allocate_slots(7, 4) == []
    assert bm.allocate_slots(7, 5) == [1]
    assert bm.block_table(7) == [0, 1]
    assert (bm.num_used_blocks, bm.num_free_blocks) == (2, 2)
    bm.check()


def test_cannot_take_more_than_free_and_a_refusal_changes_nothing():
    bm = BlockManager(num_blocks=2, block_size=4)
    assert bm.allocate_slots(1, 4) == [0]
    assert bm.num_new_blocks(1, 9) == 2
    assert bm.allocate_slots(1, 9) is None
    assert bm.block_table(1) == [0] and bm.num_free_blocks == 1
    bm.check()


def test_free_returns_everything_and_check_catches_double_release():
    bm = BlockManager(num_blocks=3, block_size=2)
    bm.allocate_slots(1, 4)
    assert bm.free(1) == 2
    assert bm.num_free_blocks == 3
    bm.device.release([0])
    with pytest.raises(AssertionError, match="free twice"):
        bm.check()


def test_swap_out_and_in_moves_blocks_between_pools():
    bm = BlockManager(num_blocks=4, block_size=2, num_swap_blocks=4)
    bm.allocate_slots(1, 4)
    out_pairs = bm.swap_out(1)
    assert [d for d, _ in out_pairs] == [0, 1]
    assert bm.num_free_blocks == 4 and bm.num_swapped_blocks == 2
    bm.allocate_slots(2, 2)  # someone else takes a device block meanwhile
    in_pairs = bm.swap_in(1, 5)  # its 4 tokens and room for one more
    assert len(in_pairs) == 2 and bm.num_swapped_blocks == 0
    assert len(bm.block_table(1)) == 3
    bm.check()


def test_check_detects_corruption():
    bm = BlockManager(num_blocks=3, block_size=2)
    bm.allocate_slots(1, 2)
    bm.block_tables[2] = list(bm.block_tables[1])  # the same block owned twice
    with pytest.raises(AssertionError, match="owned twice"):
        bm.check()


def test_swaps_are_refused_whole_when_the_other_pool_is_full():
    bm = BlockManager(num_blocks=4, block_size=2, num_swap_blocks=1)
    bm.allocate_slots(1, 4)  # two blocks: more than the swap space holds
    assert bm.swap_out(1) is None
    assert bm.block_table(1) == [0, 1] and bm.num_swapped_blocks == 0
    bm.allocate_slots(2, 2)
    assert bm.swap_out(2) == [(2, 0)]
    assert bm.allocate_slots(3, 4) == [3, 2]  # the device pool fills up meanwhile
    assert bm.swap_in(2, 2) is None
    assert bm.swap_tables[2] == [0]
    bm.check()
