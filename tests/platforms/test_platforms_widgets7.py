"""Google Colab ships ipywidgets 7.7, whose widgets display through ``_ipython_display_`` and have
no ``_repr_mimebundle_``. Stubbed here by removing ipywidgets 8's method: the pictured widgets
still give one bundle with the live view's reference and the static picture."""

from __future__ import annotations

import ipywidgets as widgets
from IPython.core.formatters import DisplayFormatter

from paged_kv_lib.viz import static

VIEW = "application/vnd.jupyter.widget-view+json"


def test_a_pictured_box_on_ipywidgets_7_keeps_the_view_and_the_picture(monkeypatch):
    monkeypatch.delattr(widgets.Widget, "_repr_mimebundle_", raising=False)
    box = static.with_picture(widgets.IntSlider(value=3), lambda: "<b>3</b>")
    bundle = box._repr_mimebundle_()
    assert bundle[VIEW]["model_id"] == box.model_id and bundle["text/html"] == "<b>3</b>"
    # IPython asks for the bundle, not ipywidgets 7's _ipython_display_ (which would drop the picture).
    data, _ = DisplayFormatter().format(box)
    assert data[VIEW]["model_id"] == box.model_id and data["text/html"] == "<b>3</b>"


def test_interact_draws_its_first_picture_from_the_controls(monkeypatch):
    seen = []
    box = static.interact(lambda n=1: seen.append(n), n=widgets.IntSlider(value=4, min=0, max=9))
    assert box is not None and seen[0] == 4
