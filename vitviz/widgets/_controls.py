"""The explorers' controls: ipywidgets' own, except that a value code sets on one is checked before it is taken.

ipywidgets clamps a number set on a slider to its range without a word (``explorer.alpha.value = 1.5`` became 1.0
and the overlay was drawn at full opacity), casts a float set on an ``IntSlider`` to an int, takes ``True`` for the
option ``1`` and answers a value that is no option with a bare ``TraitError``. Each class here is the ipywidgets
class with one change: an assignment ``control.value = v`` first calls ``control.check_value(v)``, which the
explorer that owns the control sets (``Explorer._checked``): it raises the vitviz error ``set()`` raises, naming the
control, the value, the values it takes and the fix, before the value is stored, so the control, its observers and
the figure stay as they were.

The check sits on attribute assignment, not in a traitlets ``@validate('value')``, for two reasons: a validator sees
the value after the trait's cast (``CInt`` makes 24.7 into 24, ``CFloat`` a string into a float), and the browser's
own updates arrive through ``set_state``/``set_trait``, which keep ipywidgets' handling (a JavaScript slider's value
such as ``19 * 0.05 = 0.9500000000000001`` is clamped to 0.95 as before, not refused in the kernel's log).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

__all__ = ["CheckedCheckbox", "CheckedDropdown", "CheckedFloatSlider", "CheckedIntSlider", "CheckedSelectionSlider",
           "CheckedToggleButtons"]


class _CheckedValue:
    """Mixin: ``self.value = v`` stores ``self.check_value(v)`` (which raises on a value the control cannot hold)
    when an owner set ``check_value``; until then, and for every other attribute, ipywidgets' own assignment."""

    check_value: Callable[[Any], Any] | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "value" and self.check_value is not None:
            value = self.check_value(value)
        super().__setattr__(name, value)


class CheckedFloatSlider(_CheckedValue, widgets.FloatSlider):
    """``ipywidgets.FloatSlider`` whose values set by code are checked (``vitviz.widgets._controls``)."""


class CheckedIntSlider(_CheckedValue, widgets.IntSlider):
    """``ipywidgets.IntSlider`` whose values set by code are checked (``vitviz.widgets._controls``)."""


class CheckedSelectionSlider(_CheckedValue, widgets.SelectionSlider):
    """``ipywidgets.SelectionSlider`` whose values set by code are checked (``vitviz.widgets._controls``)."""


class CheckedDropdown(_CheckedValue, widgets.Dropdown):
    """``ipywidgets.Dropdown`` whose values set by code are checked (``vitviz.widgets._controls``)."""


class CheckedToggleButtons(_CheckedValue, widgets.ToggleButtons):
    """``ipywidgets.ToggleButtons`` whose values set by code are checked (``vitviz.widgets._controls``)."""


class CheckedCheckbox(_CheckedValue, widgets.Checkbox):
    """``ipywidgets.Checkbox`` whose values set by code are checked (``vitviz.widgets._controls``)."""
