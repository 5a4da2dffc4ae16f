"""The frame shared by the explorers: one ``ipywidgets.Image`` (PNG bytes), controls, a status line, clicks.

Every control is an ipywidgets widget stored as an attribute, so code (and tests) drive an explorer by setting
``.value`` (checked as ``set()`` checks it, ``vitviz.widgets._controls``); each change re-renders the PNG in the
kernel and replaces ``image.value`` in place, and only that PNG travels to the browser; a change whose redraw
fails puts the controls back on the figure shown. Clicking the image selects a patch when ``ipyevents`` is
installed (its JupyterLab extension ships with the wheel: no CDN, no custom JavaScript); without it the row and
column sliders do the same.
"""

from __future__ import annotations

import html
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import ipywidgets as widgets
import numpy as np
from traitlets import TraitError

from vitviz.core.util import is_int, is_number
from vitviz.errors import (
    InputError,
    InputTypeError,
    NoSuchAttributeError,
    NotImplementedInVitviz,
    OutOfRangeError,
)
from vitviz.widgets._controls import CheckedSelectionSlider
from vitviz.widgets._render import cell_at

__all__ = ["Explorer", "clicks_supported", "index_slider", "resize_index_slider"]


def _index_options(count: int) -> list[tuple[str, int]]:
    return [(str(i + 1), i) for i in range(count)]


def index_slider(count: int, value: int, description: str, style: dict[str, str]) -> CheckedSelectionSlider:
    """A slider over the indices ``0 .. count - 1`` that shows them counted from 1 ("1" ... ``count``), as the
    figures' titles and the explorers' status lines count layers, rows and columns; its ``value`` stays the Python
    index the API takes (``explorer.layer.value == 5`` shows "6")."""
    return CheckedSelectionSlider(options=_index_options(count), value=value, description=description, style=style,
                                  continuous_update=False)


def resize_index_slider(slider: widgets.SelectionSlider, count: int, value: int) -> None:
    """Give an ``index_slider`` the indices ``0 .. count - 1`` and select ``value`` (call inside ``hold()``: a
    new set of options first selects index 0)."""
    slider.options = _index_options(count)
    slider.value = value


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
    ``map_size`` (``(dh, dw)`` pixels of the map inside the PNG) and ``select_patch(row, col)``; and ``grid_extent``
    (``(ch, cw)``, the top-left pixels of the map the grid covers) where it does not cover all of ``map_size``.
    """

    grid: tuple[int, int]
    map_size: tuple[int, int]

    @property
    def grid_extent(self) -> tuple[int, int]:
        """The ``(ch, cw)`` pixels of the drawn map, from its top left, that the patch grid covers (clicks beyond
        pick no patch); by default all of ``map_size``."""
        return self.map_size

    def __init__(self, controls: Sequence[widgets.Widget], *, title: str = "", **kwargs: Any) -> None:
        self.image = widgets.Image(format="png", layout=widgets.Layout(flex="0 0 auto"))
        self.status = widgets.HTML()
        self.clickable = False
        self._hold = 0
        self._setting = 0  # > 0 while set() sets values it checked (or a refused one is put back)
        self._events = self._attach_clicks()
        header = [widgets.HTML(f"<b>{html.escape(title)}</b>")] if title else []
        panel = widgets.VBox(list(controls), layout=widgets.Layout(margin="0 0 0 12px"))
        super().__init__(children=[*header, widgets.HBox([self.image, panel]), self.status], **kwargs)
        for control in controls:
            control.observe(self._on_change, names="value")
            if hasattr(control, "check_value"):  # vitviz.widgets._controls: a value code sets is checked first
                control.check_value = self._check_direct(control)
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
        """Change several controls and render once, at the end of the block. Where the block or that render raises
        (a refused value, a model that fails on the new view), the controls go back to the values they had when the
        block began, those of the figure still shown, and the error is raised."""
        with self._held(None):
            yield

    @contextmanager
    def _held(self, before: dict[str, Any] | None) -> Iterator[None]:
        """``hold()``; ``before``: the values to put back on failure where they are not the ones now (an observer's
        block begins after its control changed)."""
        outer = not self._hold
        if outer and before is None:
            before = self._values()
        self._hold += 1
        try:
            yield
        except BaseException:
            self._hold -= 1
            if outer:
                self._put_back(before)
            raise
        self._hold -= 1
        if outer:
            try:
                self.refresh()
            except BaseException:
                self._put_back(before)  # the figure shown is still that of ``before``
                raise

    def set(self, **values: Any) -> Explorer:
        """Set controls by attribute name (``explorer.set(layer=3, head="max")``) and render once.

        Each value is checked against what the ones before it made (a new resolution gives other rows); every
        control named ends at the value given (a ``row`` set after ``query=0`` no longer turns the query into
        ``"patch"``). A refused value, or a view the model fails to give, leaves every control and the figure
        as they were.

        Returns:
            the explorer itself.
        """
        unknown = [k for k in values if not isinstance(getattr(self, k, None), widgets.ValueWidget)]
        if unknown:
            raise NoSuchAttributeError(f"{type(self).__name__} has no control named {unknown}; its controls are "
                                 f"{self.control_names()}")
        before = self._values()
        self._setting += 1
        try:
            with self.hold():
                try:
                    wanted = {}
                    for name, value in values.items():
                        wanted[name] = self._checked(name, value)
                        getattr(self, name).value = wanted[name]
                    for name, value in values.items():  # one a later control moved (a row makes the query
                        if getattr(self, name).value != wanted[name]:  # "patch"): set as given, checked again
                            getattr(self, name).value = self._checked(name, value)
                    moved = {n: getattr(self, n).value for n in values if getattr(self, n).value != wanted[n]}
                    if moved:
                        raise InputError(f"{type(self).__name__}.set({values}): the controls {moved} cannot hold "
                                         "these values together; set them one at a time")
                except BaseException:
                    self._restore(before)  # also inside an outer hold(), whose block may go on
                    raise
        finally:
            self._setting -= 1
        return self

    def _values(self) -> dict[str, Any]:
        return {name: getattr(self, name).value for name in self.control_names()}

    def _put_back(self, values: dict[str, Any]) -> None:
        """Put the controls back to ``values`` without rendering (the figure shown is theirs)."""
        if self._values() == values:
            return
        self._setting += 1
        self._hold += 1
        try:
            self._restore(values)
        finally:
            self._hold -= 1
            self._setting -= 1

    def _restore(self, values: dict[str, Any]) -> None:
        """Put the controls back to ``values`` (inside ``hold()``). A value the first pass cannot set yet (a row of
        a grid that a control set later in the pass restores), or that a control set after it changes again (a
        resolution moves the row and column sliders to the same place on the new grid), is set in a later pass."""
        for _ in range(3):
            for name, value in values.items():
                try:
                    if getattr(self, name).value != value:
                        getattr(self, name).value = value
                except TraitError:
                    pass
            if all(getattr(self, name).value == value for name, value in values.items()):
                return
        for name, value in values.items():  # the last word: a value that cannot be set raises here
            getattr(self, name).value = value

    def _said(self, name: str, value: Any, direct: bool) -> str:
        """How a refused value arrived, for the message: ``Explorer.set(name=value)``, or ``Explorer.name.value =
        value`` where code set the control itself (``direct``)."""
        return f"{type(self).__name__}.{name}.value = {value!r}" if direct else \
            f"{type(self).__name__}.set({name}={value!r})"

    def _checked(self, name: str, value: Any, *, direct: bool = False) -> Any:
        """``value`` (an integer of any kind as a Python int), or refused when the control cannot hold it, naming
        the control and its values: ipywidgets would clamp a number to a slider's range without a word, and answer
        a missing choice with a bare ``TraitError``. ``set()`` checks each value before it sets it; a value code
        sets on the control itself (``direct``: ``explorer.alpha.value = 1.5``) is checked before the control takes
        it (``vitviz.widgets._controls``)."""
        said = self._said(name, value, direct)
        control = getattr(self, name)
        value = int(value) if is_int(value) else value
        if isinstance(control, widgets.Checkbox):
            if not isinstance(value, (bool, np.bool_)):
                raise InputTypeError(f"{said}: the {name} control is a checkbox; pass True or False")
            return bool(value)
        options = getattr(control, "options", None)
        if options is not None:  # dropdowns and index sliders
            pairs = [o if isinstance(o, tuple) else (str(o), o) for o in options]
            values = [v for _, v in pairs]
            if not any(type(value) is type(v) and value == v for v in values):
                shown = ", ".join(repr(v) for v in values[:12]) + (", ..." if len(values) > 12 else "")
                error = OutOfRangeError if isinstance(control, widgets.SelectionSlider) else InputError
                counted = (" (Python indices; the slider shows them counted from 1)"
                           if isinstance(control, widgets.SelectionSlider) else "")
                raise error(f"{said}: not one of the {name} control's values "
                            f"{shown}{counted}; pass one of them")
            return value
        low, high = getattr(control, "min", None), getattr(control, "max", None)
        if low is not None and high is not None and is_number(value) and not low <= value <= high:
            raise OutOfRangeError(f"{said}: outside the {name} control's range "
                                  f"[{low}, {high}]; pass a value in it")
        return value

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

    def _check_direct(self, control: widgets.ValueWidget) -> Any:
        """The ``check_value`` of ``control``: a value code sets on it is checked as ``set()`` checks it, except
        the values ``set()`` checked and those put back (``_setting``)."""
        def check(value: Any) -> Any:
            name = next((n for n in self.control_names() if getattr(self, n) is control), None)
            return value if self._setting or name is None else self._checked(name, value, direct=True)
        return check

    def _on_change(self, change: dict[str, Any]) -> None:
        name = next((n for n in self.control_names() if getattr(self, n) is change["owner"]), None)
        # the control has its new value already: where the redraw fails it goes back to the old one, the figure's
        before = None if self._hold or name is None else {**self._values(), name: change["old"]}
        with self._held(before):  # controls changed by _changed render once, with this one
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
        cell = cell_at(float(x), float(y), self.grid_extent, self.grid)
        if cell is not None:
            self.select_patch(*cell)
