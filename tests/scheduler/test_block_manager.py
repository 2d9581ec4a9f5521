"""The block manager's accounting: allocate, grow, free, swap, and the invariants."""

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minicb.core.scheduler.block_manager import BlockManager, blocks_needed


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
    # A second table holds the block without taking a reference to it.
    bm.block_tables[2] = list(bm.block_tables[1])
    with pytest.raises(AssertionError, match="1 references, 2 tables"):
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


def books(bm: BlockManager) -> tuple:
    """Everything a call could change: both tables and both free lists, in order."""
    return (
        copy.deepcopy(bm.block_tables),
        copy.deepcopy(bm.swap_tables),
        list(bm.device.free),
        list(bm.swap.free),
    )


op_st = st.tuples(
    st.sampled_from(["allocate", "free", "swap_out", "swap_in"]),
    st.integers(0, 4),  # request id
    st.integers(0, 40),  # tokens
)


@settings(max_examples=300, deadline=None)
@given(
    num_blocks=st.integers(1, 12),
    num_swap_blocks=st.integers(0, 12),
    block_size=st.sampled_from([1, 2, 4]),
    ops=st.lists(op_st, max_size=60),
)
def test_random_calls_keep_the_books_and_refusals_change_nothing(
    num_blocks, num_swap_blocks, block_size, ops
):
    bm = BlockManager(num_blocks, block_size, num_swap_blocks)
    for op, rid, n in ops:
        before = books(bm)
        table, swapped = list(bm.block_table(rid)), list(bm.swap_tables.get(rid, []))
        is_swapped = rid in bm.swap_tables
        # Calls as the scheduler makes them: a swapped-out request only swaps in or frees.
        if op == "allocate" and not is_swapped:
            result = bm.allocate_slots(rid, n)
            if result is not None:
                assert bm.block_table(rid) == table + result
                assert len(bm.block_table(rid)) == max(len(table), blocks_needed(n, block_size))
        elif op == "free":
            result = bm.free(rid)
            assert result == len(table) + len(swapped)
            assert rid not in bm.block_tables and rid not in bm.swap_tables
        elif op == "swap_out" and table and not is_swapped:
            result = bm.swap_out(rid)
            if result is not None:
                assert [d for d, _ in result] == table and rid not in bm.block_tables
                assert bm.swap_tables[rid] == [c for _, c in result]
        elif op == "swap_in" and is_swapped:
            result = bm.swap_in(rid, n)
            if result is not None:
                assert [c for c, _ in result] == swapped and rid not in bm.swap_tables
                assert [d for _, d in result] == bm.block_table(rid)[: len(swapped)]
                held = max(len(swapped), blocks_needed(n, block_size))
                assert len(bm.block_table(rid)) == held
        else:
            continue
        if result is None:
            assert books(bm) == before, f"a refused {op} changed the books"
        bm.check()
    for rid in range(5):
        bm.free(rid)
    assert bm.num_free_blocks == num_blocks and bm.num_swapped_blocks == 0
    bm.check()
