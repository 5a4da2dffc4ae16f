"""The notebooks of vitviz, installed as the package data ``vitviz.notebooks`` (``vitviz.core.resources``)."""
