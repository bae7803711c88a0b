"""Every lesson in a real JupyterLab and Chromium: pictures before anything runs, no errors after Run All,
and each interactive view answers a click or a key.

Runs only with ``-m browser`` (``make test-browser``). Screenshots land in ``test-artifacts/``
(``lesson-NN-fresh.png`` as a fresh clone shows it, ``lesson-NN-run.png`` after Run All).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # the conftest skips the test with the reason
    PlaywrightTimeout = TimeoutError

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
LESSONS = sorted(p.name for p in (REPO / "lessons").glob("[0-9][0-9]_*.ipynb"))
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
RAW_WIDGET_TEXT = ("VBox(children", "HBox(children", "interactive(children", "Output(", "Error displaying widget",
                   "Error creating widget", "model not found")
RUN_TIMEOUT_MS = 150_000


def _open(page: Any, server: Dict[str, str], name: str, workspace: str) -> None:
    # A workspace of its own, reset, so tabs opened by earlier tests are not restored beside it.
    page.goto(f"{server['base']}/lab/workspaces/{workspace}/tree/lessons/{name}?reset&token={server['token']}")
    page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").first.wait_for(timeout=90_000)
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    try:
        dialog.wait_for(timeout=2_000)
        dialog.get_by_role("button", name="Select").click()
    except PlaywrightTimeout:
        pass


def _stored_widget_outputs(name: str) -> int:
    import nbformat

    nb = nbformat.read(REPO / "lessons" / name, as_version=4)
    return sum(WIDGET_MIME in out.get("data", {}) for cell in nb.cells if cell.cell_type == "code"
               for out in cell.get("outputs", []))


def _output_texts(page: Any) -> List[str]:
    return page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output").evaluate_all(
        "els => els.map(e => e.innerText)")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", LESSONS)
def test_a_fresh_clone_shows_pictures_not_widget_text(jupyter_server, page, name):
    _open(page, jupyter_server, name, f"fresh{name[:2]}")
    page.wait_for_timeout(1_500)  # let the widget renderer try (and fall back) before we look
    texts = _output_texts(page)
    raw = [t[:80] for t in texts if any(marker in t for marker in RAW_WIDGET_TEXT)]
    assert not raw, f"{name}: widget outputs show raw text before anything ran: {raw}"
    expected = _stored_widget_outputs(name)
    pictures = page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output").evaluate_all(
        """els => els.filter(e => e.querySelector('img, svg, canvas, .pkv-static, .pkv-view, .pkv-playground-static'))
                     .length""")
    assert pictures >= expected, f"{name}: {expected} stored widget outputs but only {pictures} outputs draw a picture"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"lesson-{name[:2]}-fresh.png"))


def _interact(page: Any, root: Any) -> bool:
    """One learner action on a live widget: a slider key press, else a button click. True if the widget changed."""
    handle = root.locator(".widget-slider:not(.mod-disabled) .noUi-handle:visible").first
    buttons = root.locator("button:not([disabled]):visible")
    if handle.count():
        # ArrowRight first; a slider already at its end moves the other way.
        actions = [lambda key=key: (handle.focus(), page.keyboard.press(key)) for key in ("ArrowRight", "ArrowLeft")]
    elif buttons.count():
        actions = [lambda: buttons.first.click()]
    else:
        return True  # nothing to press: a display-only widget
    for act in actions:
        before = root.inner_html()
        act()
        try:
            page.wait_for_function("([el, html]) => el.innerHTML !== html", arg=[root.element_handle(), before],
                                   timeout=20_000)
            return True
        except PlaywrightTimeout:
            continue
    return False


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", LESSONS)
def test_run_all_has_no_errors_and_every_view_answers(jupyter_server, page, name):
    _open(page, jupyter_server, name, f"run{name[:2]}")
    page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').first.wait_for(timeout=90_000)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    # Finished when no cell waits ([*]) and the kernel is idle again.
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputPrompt')];
            const busy = prompts.some(p => p.textContent.includes('*'));
            const idle = document.querySelector('.jp-Notebook-ExecutionIndicator[data-status="idle"]');
            return prompts.length && !busy && idle;
        }""", timeout=RUN_TIMEOUT_MS)
    page.wait_for_timeout(1_000)
    errors = page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                          has_text="Traceback")
    assert errors.count() == 0, f"{name}: an error after Run All: {errors.first.inner_text()[:500]}"
    texts = _output_texts(page)
    raw = [t[:80] for t in texts if any(marker in t for marker in RAW_WIDGET_TEXT)]
    assert not raw, f"{name}: widget outputs show raw text after Run All: {raw}"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"lesson-{name[:2]}-run.png"))
    roots = page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output .jupyter-widgets.widget-container"
                         ":not(.jupyter-widgets .jupyter-widgets)")
    silent = [i for i in range(roots.count()) if not _interact(page, roots.nth(i))]
    if silent:
        page.screenshot(path=str(ARTIFACTS / f"lesson-{name[:2]}-silent.png"), full_page=True)
        labels = [roots.nth(i).locator("button, .widget-label").all_inner_texts()[:6] for i in silent]
    assert not silent, f"{name}: live widgets {silent} did not change after a click or key press: {labels}"
