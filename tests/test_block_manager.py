"""The block manager's accounting: allocate, grow, free, swap, and the invariants."""

import pytest

from minicb.block_manager import BlockManager, blocks_needed


def test_blocks_needed_rounds_up():
    assert [blocks_needed(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_allocate_grows_only_when_a_block_fills():
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.allocate(7, 3) == [0]
    assert bm.allocate(7, 4) == []
    assert bm.allocate(7, 5) == [1]
    assert bm.block_table(7) == [0, 1]
    assert (bm.num_used_blocks, bm.num_free_blocks) == (2, 2)
    bm.check()


def test_cannot_take_more_than_free():
    bm = BlockManager(num_blocks=2, block_size=4)
    assert not bm.can_allocate(1, 9)
    with pytest.raises(RuntimeError, match="only 2 are free"):
        bm.allocate(1, 9)


def test_free_returns_everything_and_check_catches_double_release():
    bm = BlockManager(num_blocks=3, block_size=2)
    bm.allocate(1, 4)
    assert bm.free(1) == 2
    assert bm.num_free_blocks == 3
    with pytest.raises(RuntimeError, match="not in use"):
        bm.device.release([0])


def test_swap_out_and_in_moves_blocks_between_pools():
    bm = BlockManager(num_blocks=4, block_size=2, num_swap_blocks=4)
    bm.allocate(1, 4)
    out_pairs = bm.swap_out(1)
    assert [d for d, _ in out_pairs] == [0, 1]
    assert bm.num_free_blocks == 4 and bm.num_swapped_blocks == 2
    bm.allocate(2, 2)  # someone else takes a device block meanwhile
    in_pairs = bm.swap_in(1)
    assert len(in_pairs) == 2 and bm.num_swapped_blocks == 0
    bm.check()


def test_check_detects_corruption():
    bm = BlockManager(num_blocks=3, block_size=2)
    bm.allocate(1, 2)
    bm.block_tables[2] = list(bm.block_tables[1])  # the same block owned twice
    with pytest.raises(AssertionError, match="owned twice"):
        bm.check()
