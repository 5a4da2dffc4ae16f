"""Which packages the wheel holds; everything else about the project is in pyproject.toml.

Besides ``vitviz`` and its subpackages, two repository folders travel as package data under names of their own,
so the repository keeps one copy of each at the top level and an installed vitviz finds them by import name
(``vitviz.core.resources``): ``notebooks/`` as ``vitviz.notebooks`` (``vitviz report`` executes them) and
``data/`` as ``vitviz.data`` (the committed study results). pyproject.toml cannot combine ``packages.find``
with packages mapped from other folders, hence this file.
"""

from setuptools import find_packages, setup

SHIPPED = {"vitviz.notebooks": "notebooks", "vitviz.data": "data"}  # as vitviz.core.resources.SHIPPED

setup(
    packages=[*find_packages(include=["vitviz", "vitviz.*"]), *SHIPPED],
    package_dir=SHIPPED,
)
