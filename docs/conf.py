"""Sphinx configuration of vitviz's documentation site (``make docs`` -> ``docs/_build/html``).

- API reference: ``api.rst`` is written here from ``vitviz._LAZY`` (and ``vitviz.__all__``'s error classes), then
  autosummary (template ``_templates/autosummary/entry.rst``) makes one page per public name: a name added to
  ``_LAZY`` gets its page with no edit here. Docstrings are Google style (napoleon).
- Example gallery: sphinx-gallery executes ``examples/*.py`` on the shipped CIFAR-10 models at every build.
- Notebooks: ``notebooks_build.py`` executes the five notebooks with small parameters (cached on the notebook and
  the parameters) into ``notebooks/``; myst-nb renders those executed copies (it executes nothing itself).
- The Markdown pages (architecture, benchmarks, coverage, ...) are read by MyST.

Warnings are errors (``-W --keep-going`` in the Makefile). Nothing is fetched: no intersphinx, no remote images.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS))  # notebooks_build, api_build

import api_build  # noqa: E402
import notebooks_build  # noqa: E402

import vitviz  # noqa: E402

os.environ.setdefault("MPLBACKEND", "Agg")

project = "vitviz"
author = "vitviz authors"
copyright = "vitviz authors"  # noqa: A001
release = version = vitviz.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx_copybutton",
    "sphinx_gallery.gen_gallery",
    "myst_nb",
]

# ---- sources ---------------------------------------------------------------------------------------------------
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "_templates", "gallery", "examples/README.txt", "**.ipynb_checkpoints",
                    "auto_examples/*.ipynb", "auto_examples/*.py", "auto_examples/*.zip", "auto_examples/*.json",
                    "auto_examples/*.codeobj.json", "auto_examples/*.md5"]
templates_path = ["_templates"]
root_doc = "index"

# ---- API reference ---------------------------------------------------------------------------------------------
api_build.write_api_page(DOCS / "api.rst")
api_build.write_plot_page(DOCS / "plot_api.md")
autosummary_generate = True
autosummary_generate_overwrite = True
autosummary_imported_members = True
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": False}
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# type hints name torch, numpy, matplotlib and pandas classes that have no page here (no intersphinx: offline)
nitpicky = False

# ---- gallery ---------------------------------------------------------------------------------------------------
sphinx_gallery_conf = {
    "examples_dirs": str(DOCS / "examples"),
    "gallery_dirs": str(DOCS / "auto_examples"),
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "matplotlib_animations": False,
    "image_scrapers": ("matplotlib",),
    "reset_modules": ("matplotlib",),
    "abort_on_example_error": True,
    "show_memory": False,
    "min_reported_time": 1,
}

# ---- notebooks -------------------------------------------------------------------------------------------------
notebooks_build.execute_all(DOCS / "notebooks")
nb_execution_mode = "off"  # the copies in notebooks/ are executed already (notebooks_build)
nb_execution_raise_on_error = True
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]  # notebooks and pages start at h1 and may skip levels in their prose

# ---- HTML ------------------------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"vitviz {release}"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 6,
    "icon_links": [],
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_show_sourcelink = False
html_copy_source = False
