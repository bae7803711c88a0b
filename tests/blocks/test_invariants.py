"""check_invariants, directly: it passes on every state the acts reach and names each corruption.

The corruptions go through ``BlockManager.table()``, the live table a caller may read but must
never change: writing it on purpose is how a test breaks the bookkeeping without private names.
"""

from __future__ import annotations

import pytest

from paged_kv_lib import InvariantError
from paged_kv_lib.block_manager import BlockManager


def prepared() -> BlockManager:
    m = BlockManager(8, 4, num_cpu_blocks=4)
    m.allocate_for_sequence(0, 6, token_ids=list(range(6)))
    m.allocate_for_sequence(1, 4)
    m.fork(1, 2)
    m.allocate_for_sequence(3, 2)
    m.swap_out(3)
    return m


def test_a_state_the_acts_reach_passes():
    m = prepared()
    m.check_invariants()
    m.check_invariants()


CORRUPTIONS = [
    ("a held block also free", lambda m: m.table(1).block_ids.append(m.free_blocks[0]), "ref_count 0 but 1 tables"),
    ("a block swapped for another", lambda m: m.table(2).block_ids.__setitem__(0, m.get_block_mapping(0)[0]),
     r"ref_count \d but \d tables hold it"),
    ("too many tokens", lambda m: setattr(m.table(1), "num_tokens", 20), "20 tokens in 1 blocks"),
    ("a reserve with room", lambda m: setattr(m.table(0), "num_tokens", 3), "sequence 0 reserved a block while its last one has room"),
    ("token ids out of step", lambda m: m.table(0).token_ids.append(9), "7 token ids for 6 tokens"),
    ("keys out of step", lambda m: m.table(0).block_keys.clear(), "0 keys for its full blocks"),
]


@pytest.mark.parametrize("name, corrupt, msg", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_each_corruption_is_named(name, corrupt, msg):
    m = prepared()
    corrupt(m)
    with pytest.raises(InvariantError, match=msg) as info:
        m.check_invariants()
    assert isinstance(info.value, AssertionError)
