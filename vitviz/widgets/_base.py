"""The frame shared by the explorers: one ``ipywidgets.Image`` (PNG bytes), controls, a status line, clicks.

Every control is a plain ipywidgets widget stored as an attribute, so code (and tests) drive an explorer by
setting ``.value``; each change re-renders the PNG in the kernel and replaces ``image.value`` in place, and only
that PNG travels to the browser. Clicking the image selects a patch when ``ipyevents`` is installed (its
JupyterLab extension ships with the wheel: no CDN, no custom JavaScript); without it the row and column sliders
do the same.
"""

from __future__ import annotations

import html
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import ipywidgets as widgets

from vitviz.errors import NoSuchAttributeError, NotImplementedInVitviz
from vitviz.widgets._render import cell_at

__all__ = ["Explorer", "clicks_supported"]


def clicks_supported() -> bool:
    """Whether ``ipyevents`` is importable, i.e. whether clicking an explorer's image picks a patch."""
    try:
        import ipyevents  # noqa: F401
    except ImportError:
        return False
    return True


class Explorer(widgets.VBox):
    """Base class: ``image`` (an ``ipywidgets.Image`` holding PNG bytes), ``status`` (HTML), controls.

    Subclasses define ``render() -> (png_bytes, status_html)``, ``grid`` (``(gh, gw)`` patches of the drawn map),
    ``map_size`` (``(dh, dw)`` pixels of the map inside the PNG) and ``select_patch(row, col)``.
    """

    grid: tuple[int, int]
    map_size: tuple[int, int]

    def __init__(self, controls: Sequence[widgets.Widget], *, title: str = "", **kwargs: Any) -> None:
        self.image = widgets.Image(format="png", layout=widgets.Layout(flex="0 0 auto"))
        self.status = widgets.HTML()
        self.clickable = False
        self._hold = 0
        self._events = self._attach_clicks()
        header = [widgets.HTML(f"<b>{html.escape(title)}</b>")] if title else []
        panel = widgets.VBox(list(controls), layout=widgets.Layout(margin="0 0 0 12px"))
        super().__init__(children=[*header, widgets.HBox([self.image, panel]), self.status], **kwargs)
        for control in controls:
            control.observe(self._on_change, names="value")
        # stable CSS classes for pages and browser tests: .vitviz-explorer, .vitviz-image, .vitviz-<control>
        self.add_class("vitviz-explorer")
        self.image.add_class("vitviz-image")
        for name in self.control_names():
            getattr(self, name).add_class(f"vitviz-{name.replace('_', '-')}")

    # -- public API ---------------------------------------------------------------------------------------------

    @property
    def png(self) -> bytes:
        """The PNG now shown (the same bytes as ``self.image.value``)."""
        return bytes(self.image.value)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Change several controls and render once, at the end of the block."""
        self._hold += 1
        try:
            yield
        finally:
            self._hold -= 1
            if not self._hold:
                self.refresh()

    def set(self, **values: Any) -> Explorer:
        """Set controls by attribute name (``explorer.set(layer=3, head="max")``) and render once.

        Returns:
            the explorer itself.
        """
        unknown = [k for k in values if not isinstance(getattr(self, k, None), widgets.ValueWidget)]
        if unknown:
            raise NoSuchAttributeError(f"{type(self).__name__} has no control named {unknown}; its controls are "
                                 f"{self.control_names()}")
        with self.hold():
            for name, value in values.items():
                getattr(self, name).value = value
        return self

    def control_names(self) -> list[str]:
        """Names of the attributes that hold controls (sliders, dropdowns, checkboxes)."""
        return sorted(k for k, v in vars(self).items() if not k.startswith("_") and isinstance(v, widgets.ValueWidget)
                      and v is not self.image and v is not self.status)

    def refresh(self) -> None:
        """Render the current selection and send it, if it changed."""
        png, text = self.render()
        if png != self.image.value:
            self.image.value = png
        self.status.value = text

    def render(self) -> tuple[bytes, str]:  # pragma: no cover - abstract
        """The PNG and status line for the current controls."""
        raise NotImplementedInVitviz

    def select_patch(self, row: int, col: int) -> None:  # pragma: no cover - abstract
        """Make patch ``(row, col)`` the query."""
        raise NotImplementedInVitviz

    # -- internals -----------------------------------------------------------------------------------------------

    def _on_change(self, change: dict[str, Any]) -> None:
        with self.hold():  # controls changed by _changed render once, with this one
            self._changed(change)

    def _changed(self, change: dict[str, Any]) -> None:
        """Hook for subclasses: keep dependent controls consistent (called before rendering)."""

    def _attach_clicks(self) -> Any:
        if not clicks_supported():
            return None
        from ipyevents import Event

        events = Event(source=self.image, watched_events=["click"], prevent_default_action=True)
        events.on_dom_event(self.on_click)
        self.clickable = True
        return events

    def on_click(self, event: dict[str, Any]) -> None:
        """Handle an ipyevents click: ``dataX``/``dataY`` are pixels of the PNG; pick the patch under them."""
        x, y = event.get("dataX"), event.get("dataY")
        if x is None or y is None:
            return
        cell = cell_at(float(x), float(y), self.map_size, self.grid)
        if cell is not None:
            self.select_patch(*cell)
