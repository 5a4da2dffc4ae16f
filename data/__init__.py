"""Committed results of vitviz's experiments, installed as the package data ``vitviz.data`` (``vitviz.core.resources``)."""
