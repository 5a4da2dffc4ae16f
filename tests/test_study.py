"""The hybrid-versus-pure sweep: smoke run end to end, resumable, finished runs never recomputed."""

from __future__ import annotations

import pandas as pd
import pytest

import vitviz.experiments.study as study
from vitviz.experiments.study import StudyConfig, plan, run_study


class Stop(Exception):
    pass


def test_plan_covers_three_sizes_per_family_at_two_budgets():
    runs = plan(StudyConfig())
    assert len(runs) == 3 * 3 * 2 and len({r["run_id"] for r in runs}) == 18
    assert {r["epochs"] for r in runs} == {2, 5} and {r["size"] for r in runs} == {"S", "M", "L"}


def test_smoke_sweep_resumes_without_repeating_runs(tmp_path, tiny_folder, monkeypatch):
    cfg = StudyConfig.smoke(data=str(tiny_folder), out=str(tmp_path / "runs"),
                            results=str(tmp_path / "results.csv"), train_subset=100, test_subset=50)
    calls = []
    real_train = study.train
    monkeypatch.setattr(study, "train", lambda tc, **kw: calls.append(tc.out) or real_train(tc, **kw))

    def kill_after_first(row):
        raise Stop(row["run_id"])

    with pytest.raises(Stop, match="vit-S-e1"):
        run_study(cfg, progress=False, on_run=kill_after_first)
    first = pd.read_csv(cfg.results)
    assert list(first.run_id) == ["vit-S-e1"]

    table = run_study(cfg, progress=False)
    assert [c.rsplit("/", 1)[-1] for c in calls] == ["vit-S-e1", "hybrid-S-e1", "resnet-S-e1"], "no run repeated"
    parsed = pd.read_csv(cfg.results)
    assert list(parsed.run_id) == ["vit-S-e1", "hybrid-S-e1", "resnet-S-e1"] == list(table.run_id)
    assert set(parsed.family) == {"Transformer (ViT)", "Hybrid", "ResNet"}
    assert (parsed.train_pflops > 0).all() and parsed.test_acc.between(0, 100).all()
    assert (parsed.images_seen == parsed.train_images * parsed.epochs).all()
    assert run_study(cfg, progress=False).equals(parsed) and len(calls) == 3, "a finished sweep trains nothing"


def test_meta_lists_pending_runs(tmp_path):
    import json

    from vitviz.experiments.study import write_meta

    cfg = StudyConfig(results=str(tmp_path / "r.csv"), sizes=("S",), epochs=(1, 2))
    write_meta(cfg, pd.DataFrame({"run_id": ["vit-S-e1"]}))
    meta = json.loads((tmp_path / "r.json").read_text())
    assert meta["runs_finished"] == 1 and meta["runs_planned"] == 6 and "vit-S-e1" not in meta["runs_pending"]
