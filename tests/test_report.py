"""The report: every figure in every format, the arrays behind them, meta.json and index.html."""

from __future__ import annotations

import json

import numpy as np

import vitviz.report as report


def test_report_offline_with_random_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv("VITVIZ_CHECKPOINTS", str(tmp_path / "none"))  # no trained checkpoints: say so
    rep = report.render_report(tmp_path / "rep", models=("cifar10-vit", "cifar10-hybrid"), formats=("png", "svg"),
                               device="cpu", progress=False)
    assert not rep.failures
    names = {f["name"] for f in rep.figures}
    assert {"cifar10-vit_pos_embed", "cifar10-vit_embedding_filters", "cifar10-hybrid_embedding_filters",
            "paper_fig5_compute_curves"} <= names
    for f in rep.figures:
        for fmt in ("png", "svg"):
            assert (rep.out / "figures" / f"{f['name']}.{fmt}").stat().st_size > 1000
        with np.load(rep.out / "arrays" / f"{f['name']}.npz") as arrays:
            assert len(arrays.files) >= 1
    meta = json.loads((rep.out / "meta.json").read_text())
    assert meta["models"]["cifar10-vit"]["trained"] is False and "random weights" in meta["models"]["cifar10-vit"]["note"]
    assert meta["versions"]["vitviz"] and meta["formats"] == ["png", "svg"]
    page = (rep.out / "index.html").read_text()
    assert page.count("<img") == len(rep.figures) and "random weights" in page
    sim = np.load(rep.out / "arrays" / "cifar10-vit_pos_embed.npz")["similarity"]
    assert sim.shape == (8, 8, 8, 8)


def test_a_failing_figure_keeps_the_others(tmp_path, monkeypatch):
    def broken(m):
        def boom():
            raise RuntimeError("boom")

        return [("broken_figure", boom)]

    monkeypatch.setattr(report, "_figure_jobs", broken)
    rep = report.render_report(tmp_path, models=("cifar10-vit",), formats=("png",), progress=False)
    assert [f["name"] for f in rep.failures] == ["broken_figure"]
    assert "paper_fig5_compute_curves" in {f["name"] for f in rep.figures}
    assert "boom" in (tmp_path / "index.html").read_text()
