"""Live widgets that also carry a static picture, so a notebook never shows raw widget text.

A notebook stores a widget's output as a widget id plus whatever other formats the object
offers. Where no widget manager runs (a fresh clone opened before Run All, GitHub,
nbconvert's HTML) the viewer falls back to those other formats; a bare ipywidget offers only
``VBox(children=(HBox(...`` as text. :class:`PicturedBox` adds a ``text/html`` picture to the
same output, and :func:`interact` does it for ``widgets.interactive`` controls by capturing
what the function draws for the controls' starting values.
"""

from __future__ import annotations

import base64
from typing import Any, Callable, Dict, Iterable, Optional

import ipywidgets as widgets

Picture = Callable[[], str]


def _view_reference(widget: widgets.Widget) -> Dict[str, Any]:
    """What ipywidgets 7 (Google Colab ships 7.7) publishes for a widget from ``_ipython_display_``;
    ipywidgets 8 returns the same from ``_repr_mimebundle_``."""
    return {"text/plain": repr(widget), "application/vnd.jupyter.widget-view+json":
            {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}}


def widget_bundle(widget: widgets.Widget, **kwargs: Any) -> Dict[str, Any]:
    """The widget's own notebook output, on ipywidgets 7 or 8."""
    own = getattr(widget, "_repr_mimebundle_", None)
    return dict(own(**kwargs) or {}) if own is not None else _view_reference(widget)


class _Pictured:
    """Adds ``picture()`` (and optionally ``text()``) to a widget's notebook output."""

    _picture: Picture
    _text: Optional[Callable[[], str]]
    # ipywidgets 7 displays widgets through _ipython_display_, which IPython prefers to the bundle
    # below; without it IPython asks for _repr_mimebundle_ (ipywidgets 8 has no _ipython_display_).
    _ipython_display_ = None

    def _repr_mimebundle_(self, **kwargs: Any) -> Dict[str, Any]:
        own = getattr(super(), "_repr_mimebundle_", None)
        bundle = dict(own(**kwargs) or {}) if own is not None else _view_reference(self)
        bundle["text/html"] = self._picture()
        if self._text is not None:
            bundle["text/plain"] = self._text()
        return bundle


class PicturedBox(_Pictured, widgets.VBox):
    """A ``VBox`` whose notebook output also holds ``picture()``, an HTML snapshot of its state."""

    def __init__(self, children: Iterable[widgets.Widget], picture: Picture, *, text: Optional[Callable[[], str]] = None,
                 **kwargs: Any) -> None:
        super().__init__(children=tuple(children), **kwargs)
        self._picture = picture
        self._text = text


class PicturedHTML(_Pictured, widgets.HTML):
    """An ``HTML`` widget (live, inline SVG) whose notebook output also holds a static picture."""

    def __init__(self, value: str, picture: Picture, *, text: Optional[Callable[[], str]] = None, **kwargs: Any) -> None:
        super().__init__(value=value, **kwargs)
        self._picture = picture
        self._text = text


def with_picture(widget: widgets.Widget, picture: Picture, *, text: Optional[Callable[[], str]] = None) -> PicturedBox:
    """``widget`` in a :class:`PicturedBox` that stores ``picture()`` beside the live view."""
    return PicturedBox([widget], picture, text=text)


def captured_html(draw: Callable[[], Any]) -> str:
    """Run ``draw()`` and return what it displayed (figures, HTML, text) as one HTML fragment."""
    from IPython.utils.capture import capture_output  # only notebooks get here

    with capture_output(display=True) as captured:
        result = draw()
    parts = [_as_html(output.data) for output in captured.outputs]
    if captured.stdout:
        parts.insert(0, f"<pre>{_escape(captured.stdout)}</pre>")
    if result is not None and hasattr(result, "_repr_html_"):
        parts.append(result._repr_html_())
    return '<div class="pkv-static">' + "".join(p for p in parts if p) + "</div>"


def interact(function: Callable[..., Any], *, manual: bool = False, **controls: Any) -> PicturedBox:
    """``widgets.interactive(function, **controls)`` plus a picture of its first drawing.

    The picture is what ``function`` shows for the controls' starting values. With
    ``manual=True`` the controls wait for their button, but the first drawing is still shown
    (an empty chart until the first press confuses more than it helps).
    """
    live = widgets.interactive(function, {"manual": manual}, **controls)
    # From the controls themselves: ipywidgets 7 fills live.kwargs only on the first update.
    start = {w._kwarg: w.get_interact_value() for w in live.kwargs_widgets}
    first = captured_html(lambda: function(**start))
    if manual:
        # Put the first drawing in the live output too, so the chart is there before any press.
        with live.out:
            function(**start)
    return with_picture(live, lambda: first)


def _as_html(data: Dict[str, Any]) -> str:
    if "image/png" in data:
        png = data["image/png"]
        if isinstance(png, bytes):
            png = base64.b64encode(png).decode("ascii")
        return f'<img style="max-width:100%" src="data:image/png;base64,{png}"/>'
    if "image/svg+xml" in data:
        return str(data["image/svg+xml"])
    if "text/html" in data:
        return str(data["text/html"])
    if "text/plain" in data:
        return f"<pre>{_escape(str(data['text/plain']))}</pre>"
    return ""


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
