"""Which packages the wheel holds; everything else about the project is in pyproject.toml.

Besides ``vitviz`` and its subpackages, two repository folders travel as package data under names of their own,
so the repository keeps one copy of each at the top level and an installed vitviz finds them by import name
(``vitviz.core.resources``): ``notebooks/`` as ``vitviz.notebooks`` (``vitviz report`` executes them) and
``data/`` as ``vitviz.data`` (the committed study results). pyproject.toml cannot combine ``packages.find``
with packages mapped from other folders, hence this file.
"""

from setuptools import find_namespace_packages, find_packages, setup

SHIPPED = {"vitviz.notebooks": "notebooks", "vitviz.data": "data"}  # as vitviz.core.resources.SHIPPED


def data_folders(package: str, folder: str) -> list[str]:
    """The folders of package data below ``folder``, as the dotted names setuptools expects for them.

    setuptools counts a folder whose name is a valid identifier as an importable (namespace) package, and warns at
    every install about each such folder that holds package data without being listed. Listing them keeps the
    install quiet; their files are still selected by ``[tool.setuptools.package-data]`` in pyproject.toml.
    """
    return [f"{package}.{name}" for name in find_namespace_packages(where=folder, exclude=["*__pycache__*"])]


PACKAGES = find_packages(include=["vitviz", "vitviz.*"])
setup(
    packages=[
        *PACKAGES,
        *SHIPPED,
        *data_folders("vitviz.data", SHIPPED["vitviz.data"]),
        *data_folders("vitviz.zoo", "vitviz/zoo"),
    ],
    package_dir=SHIPPED,
)
