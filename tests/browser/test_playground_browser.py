"""The playground in a real JupyterLab and a real Chromium: clicks reach the kernel and come back as SVG.

Runs only with ``-m browser`` (``make test-browser``); needs Debian's chromium at
/usr/bin/chromium and the ``playwright`` package (never ``playwright install``).
Screenshots land in ``test-artifacts/``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List

import pytest

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # the conftest skips the test with the reason
    PlaywrightTimeout = TimeoutError

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(240)]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
BLOCK_SIZE = 4  # as in playground.ipynb
KERNEL_TIMEOUT_MS = 90_000


def _shot(page: Any, name: str) -> None:
    """Save a picture of the playground's output (scrolled into view) for a human to look at."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(".pkv-playground").screenshot(path=str(ARTIFACTS / f"playground-{name}.png"))


def _set_int(page: Any, css: str, value: int) -> None:
    """Type into an ipywidgets IntText and commit it (they sync on Enter or blur)."""
    box = page.locator(f"{css} input")
    box.fill(str(value))
    box.press("Enter")


def _run_all(page: Any, tries: int = 3) -> None:
    """Run every cell from the menu, as a learner would. On a busy machine the notebook can
    report idle before its kernel takes requests, and the click then runs nothing: try again
    until the first code cell shows it ran (a number or ``*`` in its prompt)."""
    for _ in range(tries):
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        try:
            page.wait_for_function(
                r"""() => {
                    const p = document.querySelector('.jp-Notebook .jp-CodeCell .jp-InputPrompt');
                    return p && /\[(\d+|\*)\]/.test(p.textContent);
                }""", timeout=20_000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"Run All Cells ran nothing in {tries} tries")


def _logical_blocks(page: Any, seq_id: int) -> List[int]:
    cells = page.locator(f'.pkv-playground svg.pkv-block-table g.pkv-logical[data-seq="{seq_id}"]')
    return [int(x) for x in cells.evaluate_all("els => els.map(e => e.getAttribute('data-block-id'))")]


def _pool_owned(page: Any, seq_id: int) -> List[int]:
    cells = page.locator(".pkv-playground svg.pkv-block-table g.pkv-block")
    rows = cells.evaluate_all(
        "els => els.map(e => [e.getAttribute('data-block-id'), e.getAttribute('data-seq')])")
    return [int(bid) for bid, seqs in rows if str(seq_id) in seqs.split()]


def _kernel_state(page: Any, cell_index: int = 2) -> Dict[str, Any]:
    """Re-run the notebook's state cell through the UI and parse the JSON it prints."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(cell_index)
    outputs = cell.locator(".jp-OutputArea-output")
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    # The re-run replaces the output; wait until a fresh prompt number shows it has finished.
    previous = cell.get_attribute("data-pkv-run") or "0"
    page.wait_for_function(
        """([el, prev]) => {
            const p = el.querySelector('.jp-InputPrompt');
            const m = p && p.textContent.match(/\\[(\\d+)\\]/);
            return m && m[1] !== prev && el.querySelector('.jp-OutputArea-output');
        }""",
        arg=[cell.element_handle(), previous],
        timeout=KERNEL_TIMEOUT_MS,
    )
    prompt = cell.locator(".jp-InputPrompt").inner_text()
    cell.evaluate("(el, n) => el.setAttribute('data-pkv-run', n)", re.search(r"\[(\d+)\]", prompt).group(1))
    text = outputs.first.inner_text()
    match = re.search(r"STATE (\{.*\})", text)
    assert match, f"the state cell printed no STATE line: {text!r}"
    return json.loads(match.group(1))


def test_playground_buttons_drive_the_kernel_allocator(jupyter_server, page):
    url = f"{jupyter_server['base']}/lab/tree/playground.ipynb?token={jupyter_server['token']}"
    page.goto(url)
    page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").first.wait_for(timeout=KERNEL_TIMEOUT_MS)
    # Older JupyterLabs ask which kernel to start even with autoStartDefaultKernel: accept the default.
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    try:
        dialog.wait_for(timeout=3_000)
        dialog.get_by_role("button", name="Select").click()
    except PlaywrightTimeout:
        pass
    page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').first.wait_for(
        timeout=KERNEL_TIMEOUT_MS)

    _run_all(page)
    playground = page.locator(".pkv-playground")
    playground.wait_for(timeout=KERNEL_TIMEOUT_MS)
    page.locator(".pkv-playground svg.pkv-block-table").wait_for()
    assert page.locator('.pkv-playground svg.pkv-block-table g.pkv-block[data-state="free"]').count() == 12
    state = _kernel_state(page)
    assert state["seq_ids"] == [] and len(state["free_blocks"]) == 12
    page.screenshot(path=str(ARTIFACTS / "playground-0-lab.png"))
    _shot(page, "1-started")

    # Add a sequence of 9 prompt tokens: 3 blocks appear, owned by seq 0, in pool and table.
    _set_int(page, ".pkv-prompt-tokens", 9)
    page.locator(".pkv-add button, button.pkv-add").first.click()
    page.locator('.pkv-playground svg.pkv-block-table g.pkv-logical[data-seq="0"]').nth(2).wait_for()
    assert page.locator('.pkv-playground svg.pkv-block-table g.pkv-logical[data-seq="0"]').count() == 3
    page.locator(".pkv-log-line", has_text="added seq 0: 9 tokens").wait_for()
    shown = _logical_blocks(page, 0)
    assert sorted(_pool_owned(page, 0)) == sorted(shown)

    # Grow it by 4 tokens: 13 tokens need a fourth block.
    _set_int(page, ".pkv-num-tokens", 4)
    page.locator(".pkv-append button, button.pkv-append").first.click()
    page.locator('.pkv-playground svg.pkv-block-table g.pkv-logical[data-seq="0"]').nth(3).wait_for()
    page.locator(".pkv-log-line", has_text="seq 0: +4 tokens (13 in all)").wait_for()

    # A prompt that cannot fit: the error is a log line, not a traceback, and nothing changes.
    _set_int(page, ".pkv-prompt-tokens", 1000)
    page.locator(".pkv-add button, button.pkv-add").first.click()
    error = page.locator(".pkv-log-line.pkv-error", has_text="OutOfBlocksError")
    error.wait_for()
    assert "need 250, only 8 free" in error.inner_text()
    assert page.locator(".jp-Notebook .jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']").count() == 0

    # The kernel's allocator is the one the DOM shows.
    state = _kernel_state(page)
    shown = _logical_blocks(page, 0)
    assert state["seq_ids"] == [0]
    assert state["mappings"] == {"0": shown}
    assert len(shown) == -(-13 // BLOCK_SIZE)
    free_drawn = page.locator(".pkv-playground svg.pkv-free-queue g.pkv-free-entry").evaluate_all(
        "els => els.map(e => Number(e.getAttribute('data-block-id')))")
    assert free_drawn == state["free_blocks"]
    _shot(page, "2-after-add-append")

    # Fork: shared blocks when the allocator has fork(), a readable refusal when it doesn't.
    page.locator(".pkv-fork button, button.pkv-fork").first.click()
    if not state["has_fork"]:
        page.locator(".pkv-log-line.pkv-error", has_text="no fork()").wait_for()
        return
    page.locator(".pkv-log-line", has_text="forked seq 0 -> seq 1").wait_for()
    state = _kernel_state(page)
    assert state["mappings"]["1"] == _logical_blocks(page, 1) == state["mappings"]["0"]
    shared = page.locator('.pkv-playground svg.pkv-block-table g.pkv-block[data-ref-count="2"]').count()
    assert shared == len(state["mappings"]["0"])
    marks = _check_picture(page, state)
    # Every block of seq 0 is shared now, and the fork changed exactly those.
    assert {b for b, m in marks.items() if "shared" in m} == set(state["mappings"]["0"])
    assert {b for b, m in marks.items() if "changed" in m} == set(state["mappings"]["0"])
    _shot(page, "3-after-fork")

    # Free seq 0: seq 1 still holds every block, so none is free, none is shared any more, and
    # the log says so (it used to say "blocks [] back to the free queue" and mark them "shared").
    held = state["mappings"]["0"]
    page.locator(".pkv-seq-select select").select_option(label="seq 0")
    page.locator(".pkv-free button, button.pkv-free").first.click()
    page.locator(".pkv-log-line", has_text="freed seq 0: no block went back to the free queue").wait_for()
    assert f"its 4 blocks {held} stay in use by seq 1" in page.locator(".pkv-log-line").last.inner_text()
    state = _kernel_state(page)
    assert "0" not in state["mappings"]
    assert page.locator('.pkv-playground svg.pkv-block-table g.pkv-logical[data-seq="0"]').count() == 0
    free_drawn = page.locator(".pkv-playground svg.pkv-free-queue g.pkv-free-entry").evaluate_all(
        "els => els.map(e => Number(e.getAttribute('data-block-id')))")
    assert free_drawn == state["free_blocks"]
    marks = _check_picture(page, state)
    assert not any("shared" in m for m in marks.values())
    assert {b for b, m in marks.items() if "changed" in m} == set(held)
    _shot(page, "4-after-free")

    # Swap seq 1 out: its blocks are free (and marked changed), seq 1 waits in the CPU pool.
    page.locator(".pkv-seq-select select").select_option(label="seq 1")
    page.locator(".pkv-swap-out button, button.pkv-swap-out").first.click()
    page.locator(".pkv-log-line", has_text="swapped out seq 1").wait_for()
    state = _kernel_state(page)
    assert state["swapped"] == [1] and state["mappings"] == {}
    assert page.locator('.pkv-playground svg.pkv-block-table g.pkv-swapped[data-seq="1"]').count() == 1
    marks = _check_picture(page, state)
    assert {b for b, m in marks.items() if "changed" in m} == set(held)
    assert all(marks[b] == {"free", "changed"} for b in held)
    _shot(page, "5-after-swap-out")

    # Swap it back in: device blocks again, the ones it took marked changed.
    page.locator(".pkv-seq-select select").select_option(label="seq 1 (swapped out)")
    page.locator(".pkv-swap-in button, button.pkv-swap-in").first.click()
    page.locator(".pkv-log-line", has_text="swapped in seq 1").wait_for()
    state = _kernel_state(page)
    assert state["swapped"] == [] and state["mappings"]["1"] == _logical_blocks(page, 1)
    marks = _check_picture(page, state)
    assert set(state["mappings"]["1"]) <= {b for b, m in marks.items() if "changed" in m}
    _shot(page, "6-after-swap-in")


def _expected_marks(state: Dict[str, Any]) -> Dict[int, set]:
    """The marks each block must show, from the kernel's allocator (the legend's meanings)."""
    marks = {}
    for block_id, (ref_count, hashed) in state["blocks"].items():
        m = set()
        if ref_count == 0:
            m.add("cached" if hashed else "free")
        elif hashed:
            m.add("hashed")
        if ref_count > 1:
            m.add("shared")
        if int(block_id) in state["changed"]:
            m.add("changed")
        marks[int(block_id)] = m
    return marks


def _check_picture(page: Any, state: Dict[str, Any]) -> Dict[int, set]:
    """Each block in the page's SVG draws exactly its marks, and the legend explains each one."""
    svg = ".pkv-playground svg.pkv-block-table"
    rows = page.locator(f"{svg} g.pkv-block").evaluate_all(
        """els => els.map(e => [
            Number(e.getAttribute('data-block-id')),
            (e.getAttribute('data-marks') || '').split(' ').filter(Boolean),
            Array.from(e.querySelectorAll('[class*="pkv-mark-"]'))
                 .map(m => m.getAttribute('class').match(/pkv-mark-([a-z]+)/)[1]),
        ])""")
    legend = dict(page.locator(f"{svg} g.pkv-legend-item").evaluate_all(
        "els => els.map(e => [e.getAttribute('data-kind'), e.textContent])"))
    want = _expected_marks(state)
    drawn = {block_id: set(listed) for block_id, listed, _ in rows}
    assert drawn == want
    for block_id, listed, elements in rows:
        assert sorted(elements) == sorted(listed), f"block {block_id} lists {listed} but draws {elements}"
    meanings = {"shared": "ref count > 1", "changed": "last action", "free": "free queue",
                "cached": "free", "hashed": "prefix cache"}
    for mark in set().union(*drawn.values()):
        assert meanings[mark] in legend.get(mark, ""), f"the legend does not explain {mark!r}: {legend}"
    assert ("shared" in legend) == any("shared" in m for m in drawn.values())
    assert ("changed" in legend) == any("changed" in m for m in drawn.values())
    return drawn


def test_stored_pictures_show_in_an_untrusted_notebook(jupyter_server, page):
    """A lesson's stored view outputs must still draw when JupyterLab sanitizes them."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from paged_kv_lib import PagedKVCacheAllocator
    from paged_kv_lib.viz import AddressTranslationView, BlockTableView, FreeQueueView

    alloc = PagedKVCacheAllocator(12, 4, 1, 2)
    alloc.allocate_for_sequence(0, 9)
    alloc.allocate_for_sequence(1, 5)
    alloc.free_sequence(0)
    views = [BlockTableView(alloc), FreeQueueView(alloc), AddressTranslationView(alloc, 1, 4)]
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    for i, view in enumerate(views):
        cell = new_code_cell(type(view).__name__ + "(alloc)", execution_count=i + 1)
        cell.outputs = [new_output("execute_result", execution_count=i + 1,
                                   data={"text/html": view._repr_html_(), "text/plain": repr(view)})]
        nb.cells.append(cell)
    nbformat.write(nb, f"{jupyter_server['root']}/stored.ipynb")  # unsigned, so untrusted

    page.goto(f"{jupyter_server['base']}/lab/tree/stored.ipynb?token={jupyter_server['token']}")
    pictures = page.locator('.jp-OutputArea-output img[src^="data:image/svg+xml"]')
    pictures.nth(len(views) - 1).wait_for(timeout=KERNEL_TIMEOUT_MS)
    sizes = pictures.evaluate_all("els => els.map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
    assert len(sizes) == len(views)
    assert all(done and w > 100 and h > 30 for done, w, h in sizes), sizes
    assert page.locator(".jp-OutputArea-output", has_text="logical block").count() >= 1  # translation table
    page.screenshot(path=str(ARTIFACTS / "stored-untrusted.png"))
