"""Every mark the playground draws on a block means what its legend says (issue 34, item 8).

A hypothesis state machine drives a real playground with random acts (add a prompt, with or
without token ids that share prefixes; append; fork; free; swap out and in; a refused act
now and then) and, after each act, reads the block-table SVG the way a learner reads it:
a block's marks are told apart only by how they are drawn, matched against the legend's
swatches. The marks read from the picture must be exactly the facts the allocator holds:

* shared: ``ref_count > 1``;
* free: ``ref_count == 0`` and no prefix hash; cached: ``ref_count == 0`` with a hash;
* hashed (the corner flag): a used block whose full content is in the prefix cache;
* changed: the act changed the block (who holds it, how full it is, its hash, free or not),
  computed here from the allocator before and after the act.

No mark may be drawn that the legend does not explain (a thick or dashed outline without a
swatch of the same stroke), and each legend label must say what its mark means.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Dict, Optional, Set, Tuple

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from paged_kv_lib.viz import Playground

SVG = "{http://www.w3.org/2000/svg}"
NUM_BLOCKS, BLOCK_SIZE = 8, 2
# Prompts are cut from one stream of token ids, so two prompts often share full blocks.
STREAM = [7, 3, 9, 1, 4, 4, 8, 2, 6, 5, 0, 11]

Stroke = Tuple[Optional[str], float, Optional[str]]


def stroke_of(el: ET.Element) -> Stroke:
    """How an outline is drawn: its colour, width and dash pattern (SVG defaults filled in)."""
    return (el.get("stroke"), float(el.get("stroke-width", "1")), el.get("stroke-dasharray"))


def legend_swatches(root: ET.Element) -> Dict[str, ET.Element]:
    """The legend's entries by kind: the group holding the swatch and its label."""
    return {g.get("data-kind"): g for g in root.iter(SVG + "g") if g.get("class") == "pkv-legend-item"}


def legend_label(item: ET.Element) -> str:
    return "".join(t.text or "" for t in item.iter(SVG + "text"))


def drawn_marks(block: ET.Element, legend: Dict[str, ET.Element]) -> Set[str]:
    """The marks a reader sees on one block, each recognised by its legend swatch's look."""
    marks: Set[str] = set()
    fills = {kind: item.find(SVG + "rect").get("fill") for kind, item in legend.items() if kind in ("free", "cached")}
    outlines = {stroke_of(item.find(SVG + "rect")): kind for kind, item in legend.items()
                if kind in ("shared", "changed")}
    flag = legend.get("hashed")
    flag_fill = flag.find(SVG + "path").get("fill") if flag is not None else None
    for rect in block.iter(SVG + "rect"):
        if "pkv-slot" in (rect.get("class") or ""):
            continue
        for kind, fill in fills.items():
            if rect.get("fill") == fill:
                marks.add(kind)
        if rect.get("stroke") is None or rect.get("fill") != "none":
            continue
        look = stroke_of(rect)
        if look in outlines:
            marks.add(outlines[look])
        elif look[1] > 1:
            raise AssertionError(f"block {block.get('data-block-id')}: a thick outline {look} that no legend "
                                 f"entry explains (legend: {sorted(legend)})")
    for path in block.iter(SVG + "path"):
        if flag_fill is not None and path.get("fill") == flag_fill:
            marks.add("hashed")
    return marks


def block_facts(allocator) -> Dict[int, Tuple[int, Tuple[int, ...], int, object]]:
    """Per block: ref_count, the sequences whose tables hold it, their most tokens in it, its hash."""
    holders: Dict[int, list] = {}
    fill: Dict[int, int] = {}
    size = allocator.block_size
    for seq_id, table in allocator.sequence_block_tables.items():
        for i, block_id in enumerate(table.block_ids):
            holders.setdefault(block_id, []).append(seq_id)
            tokens = max(0, min(size, table.num_tokens - i * size))
            fill[block_id] = max(fill.get(block_id, 0), tokens)
    return {b.block_id: (b.ref_count, tuple(sorted(holders.get(b.block_id, ()))), fill.get(b.block_id, 0),
                         b.block_hash)
            for b in allocator.blocks}


def expected_marks(facts, before) -> Dict[int, Set[str]]:
    """The marks each block should show, from the allocator's facts (and those before the act)."""
    now = seen(facts)
    marks: Dict[int, Set[str]] = {}
    for block_id, (ref_count, _, _, block_hash) in facts.items():
        m: Set[str] = set()
        if ref_count == 0:
            m.add("cached" if block_hash is not None else "free")
        elif block_hash is not None:
            m.add("hashed")
        if ref_count > 1:
            m.add("shared")
        if before is not None and before[block_id] != now[block_id]:
            m.add("changed")
        marks[block_id] = m
    return marks


def seen(facts):
    """The facts whose change the "changed" mark reports: used or not, holders, fill, hash (a
    ref count that moves without a table gaining or losing the block is no visible change)."""
    return {b: (rc > 0, holders, fill if rc > 0 else 0, h) for b, (rc, holders, fill, h) in facts.items()}


class PlaygroundMarks(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pg = Playground(num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
        self.before: Optional[dict] = None

    def _act(self, action) -> None:
        self.before = seen(block_facts(self.pg.allocator))
        action()

    def _pick(self, index: int) -> int:
        ids = self.pg._all_seq_ids()
        return ids[index % len(ids)] if ids else 99  # 99: no such sequence, the act is refused

    @rule(n=st.integers(0, 3 * BLOCK_SIZE))
    def add_count(self, n):
        self._act(lambda: self.pg.add_sequence(n))

    @rule(start=st.sampled_from([0, 0, 2]), n=st.integers(1, 3 * BLOCK_SIZE))
    def add_tokens(self, start, n):
        self._act(lambda: self.pg.add_sequence(token_ids=STREAM[start:start + n]))

    @rule(i=st.integers(0, 7), n=st.integers(0, 2 * BLOCK_SIZE))
    def append(self, i, n):
        self._act(lambda: self.pg.append(self._pick(i), n))

    @rule(i=st.integers(0, 7))
    def fork(self, i):
        self._act(lambda: self.pg.fork(self._pick(i)))

    @rule(i=st.integers(0, 7))
    def free(self, i):
        self._act(lambda: self.pg.free(self._pick(i)))

    @rule(i=st.integers(0, 7))
    def swap_out(self, i):
        self._act(lambda: self.pg.swap_out(self._pick(i)))

    @rule(i=st.integers(0, 7))
    def swap_in(self, i):
        self._act(lambda: self.pg.swap_in(self._pick(i)))

    @invariant()
    def every_mark_means_what_the_legend_says(self):
        assert not any(line.startswith("error: invariants broken") for line in self.pg.log)
        root = ET.fromstring(self.pg.block_table.svg())
        legend = legend_swatches(root)
        labels = {kind: legend_label(item) for kind, item in legend.items()}
        assert "ref count > 1" in labels.get("shared", "ref count > 1")
        assert "last action" in labels.get("changed", "last action")
        assert "free" in labels["free"] and "prefix" in labels.get("hashed", "prefix")
        facts = block_facts(self.pg.allocator)
        want = expected_marks(facts, self.before)
        blocks = [g for g in root.iter(SVG + "g") if "pkv-block" in (g.get("class") or "").split()]
        assert len(blocks) == NUM_BLOCKS
        for block in blocks:
            block_id = int(block.get("data-block-id"))
            got = drawn_marks(block, legend)
            assert got == want[block_id], (
                f"block {block_id} is drawn as {sorted(got)} but is {sorted(want[block_id])} "
                f"(ref_count {facts[block_id][0]}); log: {self.pg.log[-1:]}")
        # The DOM says the same, for the browser test and anyone inspecting the picture.
        for block in blocks:
            assert set(block.get("data-marks", "").split()) == want[int(block.get("data-block-id"))]


PlaygroundMarks.TestCase.settings = settings(max_examples=30, stateful_step_count=12, deadline=None)
test_playground_marks_match_the_allocator = PlaygroundMarks.TestCase
