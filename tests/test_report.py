"""The report: executed notebooks as HTML, every figure in every format, the arrays behind them, meta.json, index."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
from PIL import Image

import vitviz.report as report
from vitviz.__main__ import main
from vitviz.errors import InputError
from vitviz.report.notebooks import parameters_for

ROOT = Path(__file__).resolve().parents[1]


def write_notebook(path: Path, parameters: str, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(parameters)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {path.stem}"), params, *map(nbformat.v4.new_code_cell, cells)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_package_figures_offline_with_random_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv("VITVIZ_CHECKPOINTS", str(tmp_path / "none"))  # no trained checkpoints: say so
    rep = report.render_report(tmp_path / "rep", models=("cifar10-vit", "cifar10-hybrid"), formats=("png", "svg"),
                               device="cpu", progress=False, notebooks=())
    assert not rep.failures and rep.notebooks == []
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
    assert meta["versions"]["vitviz"] and meta["versions"]["timm"] and meta["versions"]["torch"]
    assert meta["formats"] == ["png", "svg"] and meta["device"] == "cpu"
    assert meta["resolution"] == {"cifar10-vit": [32, 32], "cifar10-hybrid": [32, 32]}
    page = (rep.out / "index.html").read_text()
    assert page.count("<img") == len(rep.figures) and "random weights" in page
    sim = np.load(rep.out / "arrays" / "cifar10-vit_pos_embed.npz")["similarity"]
    assert sim.shape == (8, 8, 8, 8)


def test_a_checkpoint_is_the_models_weights_in_the_figures_and_goes_to_every_notebook_of_that_model(tmp_path):
    """``render_report(model=..., checkpoint=FILE)`` (``vitviz report --model M --checkpoint FILE``): the package
    figures draw the file's weights, not the shipped ones; every shipped notebook that takes the model also takes the
    file; a notebook that takes the model but not the file is refused rather than run on other weights."""
    import torch
    from safetensors.torch import save_file

    import vitviz
    from vitviz.zoo.reference import build_reference

    torch.manual_seed(1)
    own = build_reference("cifar10-vit")  # weights of its own, unlike the shipped checkpoint's
    save_file({k: v.contiguous() for k, v in own.state_dict().items()}, str(tmp_path / "mine.safetensors"))
    rep = report.render_report(tmp_path / "rep", formats=("png",), device="cpu", progress=False, notebooks=(),
                               model="cifar10-vit", checkpoint=tmp_path / "mine.safetensors")
    assert not rep.failures
    sim = np.load(rep.out / "arrays" / "cifar10-vit_pos_embed.npz")["similarity"]
    for model, same in ((own, True), (vitviz.load_model("cifar10-vit", device="cpu"), False)):
        expected = vitviz.pos_embed_similarity(model).detach().numpy()
        assert np.allclose(sim, expected, atol=1e-6) is same
    meta = json.loads((rep.out / "meta.json").read_text())
    assert meta["checkpoint"] == str((tmp_path / "mine.safetensors").resolve())
    assert meta["models"]["cifar10-vit"]["trained"] is True
    for stem, name in (("01_position_embeddings", "model_name"), ("02_attention", "vit_model"),
                       ("03_hybrid_vs_pure", "vit_model"), ("04_faithfulness", "model_name")):
        params = parameters_for(ROOT / "notebooks" / f"{stem}.ipynb", model="m", checkpoint="w.npz")
        assert (params[name], params["checkpoint"]) == ("m", "w.npz"), stem
    nb = write_notebook(tmp_path / "no_checkpoint.ipynb", 'model_name = "x"')
    with pytest.raises(InputError, match="takes model_name but no checkpoint parameter.*'x' without the weights"):
        parameters_for(nb, model="x", checkpoint="w.npz")
    assert parameters_for(nb, model="x") == {"model_name": "x"}
    with pytest.raises(InputError, match="without model="):
        report.render_report(tmp_path / "r2", progress=False, notebooks=(), checkpoint=tmp_path / "mine.safetensors")
    with pytest.raises(FileNotFoundError, match="is not a file"):
        report.render_report(tmp_path / "r2", progress=False, notebooks=(), model="cifar10-vit",
                             checkpoint=tmp_path / "typo.safetensors")


def test_two_checkpoints_of_one_architecture_each_draw_their_own_figures(tmp_path):
    """``render_report(models=(M, M), checkpoint=(a, b))`` (``--model M --checkpoint a --model M --checkpoint b``):
    each file's figures under a key of its own (``M-a``, ``M-b``), each drawn from its own weights; a model given
    once keeps its plain key; a figure puts their attention distances side by side; the notebooks get the first
    model with its file; ``meta.json`` and the index name each model's file. Keys that would clash, a count that
    does not match and a missing file are refused first."""
    import torch
    from safetensors.torch import save_file

    import vitviz
    from vitviz.zoo.reference import build_reference

    own = {}
    for seed, stem in ((1, "early"), (2, "late")):
        torch.manual_seed(seed)
        own[stem] = build_reference("cifar10-vit")
        save_file({k: v.contiguous() for k, v in own[stem].state_dict().items()}, str(tmp_path / f"{stem}.safetensors"))
    files = (tmp_path / "early.safetensors", tmp_path / "late.safetensors", None)
    rep = report.render_report(tmp_path / "rep", models=("cifar10-vit", "cifar10-vit", "cifar10-vit-2dpos"),
                               formats=("png",), device="cpu", progress=False, notebooks=(), checkpoint=files)
    assert not rep.failures
    names = {f["name"] for f in rep.figures}
    assert {"cifar10-vit-early_pos_embed", "cifar10-vit-late_pos_embed", "cifar10-vit-2dpos_pos_embed"} <= names
    assert not any(n.startswith("cifar10-vit_") for n in names)
    for stem in ("early", "late"):
        sim = np.load(rep.out / "arrays" / f"cifar10-vit-{stem}_pos_embed.npz")["similarity"]
        assert np.allclose(sim, vitviz.pos_embed_similarity(own[stem]).detach().numpy(), atol=1e-6)
    a, b = (np.load(rep.out / "arrays" / f"cifar10-vit-{s}_pos_embed.npz")["similarity"] for s in ("early", "late"))
    assert not np.allclose(a, b)
    with np.load(rep.out / "arrays" / "compare_attention_distance.npz") as compared:  # the models side by side
        assert list(compared["models"]) == ["cifar10-vit-early", "cifar10-vit-late", "cifar10-vit-2dpos"]
        for key in compared["models"]:
            own_figure = np.load(rep.out / "arrays" / f"{key}_attention_distance.npz")["distance_px"]
            assert np.array_equal(compared[f"distance_px_{key}"], own_figure)
    (job,) = report._comparison_jobs({"only": {"distance_px": own_figure, "images": 4, "source": "x"}})
    with pytest.raises(InputError, match=r"two models or more; only \['only'\] had them"):
        job[1]()
    meta = json.loads((rep.out / "meta.json").read_text())
    assert (meta["model"], meta["checkpoint"]) == ("cifar10-vit", str(files[0].resolve()))
    assert meta["models"]["cifar10-vit-late"]["checkpoint"] == str(files[1].resolve())
    assert meta["models"]["cifar10-vit-2dpos"]["checkpoint"] is None
    assert meta["models"]["cifar10-vit-late"]["name"] == "cifar10-vit"
    page = (rep.out / "index.html").read_text()
    assert page.count("<p>Weights: <code>") == 2 and "late.safetensors" in page
    import matplotlib.pyplot as plt

    for file, says in ((files[1], True), (None, False)):  # a figure of a given file names it in its title
        for name, job in report._figure_jobs(report.LoadedModel("k", own["late"], True, checkpoint=file))[:2]:
            fig, _ = job()
            assert any(a.get_title().endswith("\nweights: late.safetensors") for a in fig.axes) is says, name
            plt.close(fig)

    def refused(**kwargs):
        with pytest.raises((InputError, FileNotFoundError)) as e:
            report.render_report(tmp_path / "r2", progress=False, notebooks=(), **kwargs)
        return str(e.value)

    twice = ("cifar10-vit", "cifar10-vit")
    assert "would write figures under the same name 'cifar10-vit-own'" in refused(models=twice, checkpoint=(None, None))
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "early.safetensors").write_bytes(files[1].read_bytes())  # another file of the same stem
    assert "would write figures under the same name 'cifar10-vit-early'" in refused(
        models=twice, checkpoint=(files[0], tmp_path / "copy" / "early.safetensors"))
    assert "would write figures under the same name 'cifar10-vit-early'" in refused(
        models=twice, model="cifar10-vit", checkpoint=files[0])
    assert "holds 1 files for 2 models" in refused(models=twice, checkpoint=[files[0]])
    assert "without models=" in refused(model="cifar10-vit", checkpoint=[files[0]])
    assert "'nope.pth' is not a file" in refused(models=twice, checkpoint=(files[0], "nope.pth"))
    assert not (tmp_path / "r2").exists()  # refused before anything is written


def test_a_failing_figure_keeps_the_others(tmp_path, monkeypatch):
    def broken(m, images=None, distances=None):
        def boom():
            raise RuntimeError("boom")

        return [("broken_figure", boom)]

    monkeypatch.setattr(report, "_figure_jobs", broken)
    rep = report.render_report(tmp_path, models=("cifar10-vit",), formats=("png",), progress=False, notebooks=())
    assert [f["name"] for f in rep.failures] == ["broken_figure"]
    assert "paper_fig5_compute_curves" in {f["name"] for f in rep.figures}
    assert "boom" in (tmp_path / "index.html").read_text()


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).parents[1] / "notebooks").glob("*.ipynb")))
def test_every_parameter_of_a_shipped_notebook_is_declared_to_papermill(name):
    """papermill reads a parameters cell line by line and drops a line it cannot parse (a comment holding ``=``):
    such a parameter would be missing from ``notebook_parameters`` and from ``papermill --help-notebook``."""
    import ast

    from vitviz.report.notebooks import notebook_parameters

    path = Path(__file__).parents[1] / "notebooks" / name
    cell = next(c for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", []))
    assigned = [t.id for node in ast.parse(cell.source).body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)]
    assert assigned and list(notebook_parameters(path)) == assigned


def test_parameters_go_only_to_notebooks_that_declare_them(tmp_path):
    nb = write_notebook(tmp_path / "a.ipynb", 'out_dir = None\ndata_dir = None\nmodel_name = "cifar10-vit"')
    assert parameters_for(nb, out_dir=tmp_path / "f", arrays_dir=tmp_path / "a", model="vit_tiny_patch16_224",
                          images=None) == {"out_dir": str(tmp_path / "f"), "model_name": "vit_tiny_patch16_224"}
    assert parameters_for(nb, images="imgs") == {"data_dir": "imgs"}
    bare = write_notebook(tmp_path / "b.ipynb", "x = 1")
    assert parameters_for(bare, out_dir="f", model="m") == {}


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.timeout(600)
def test_notebooks_run_headless_and_a_failure_names_its_cell(tmp_path, monkeypatch):
    books = tmp_path / "books"
    books.mkdir()
    for cls in ("cat", "dog"):  # a two-image CIFAR-style test folder, which the package figures read as well
        (tmp_path / "cifar" / "test" / cls).mkdir(parents=True)
        Image.fromarray(np.full((32, 32, 3), 40 if cls == "cat" else 200, np.uint8)).save(
            tmp_path / "cifar" / "test" / cls / "0000.png")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VITVIZ_DATA", "cifar")  # relative to where the report starts, not to the notebook's folder
    good = write_notebook(
        books / "a_good.ipynb",
        'out_dir = None\narrays_dir = None\nmodel_name = "unset"\nimages_dir = None',
        "import matplotlib.pyplot as plt\nimport vitviz\nfig = plt.figure(figsize=(2, 2))\n"
        "plt.plot([0, 1], [1, 0])\nvitviz.save_figure(fig, f'{out_dir}/toy_line', formats=('png', 'svg'))\n"
        "vitviz.save_arrays(f'{arrays_dir}/toy_line', y=[1.0, 0.0])",
        "print('model', model_name, 'images', images_dir)",
        "from vitviz.zoo.samples import resolve_test_folder\nprint('data', resolve_test_folder())",
    )
    broken = write_notebook(books / "b_broken.ipynb", "out_dir = None", "x = 1",
                            "raise ValueError('deliberate failure')", "y = 2")
    images = tmp_path / "imgs"  # a flat folder of your own images: the notebooks and the package figures get it
    images.mkdir()
    Image.fromarray(np.full((32, 32, 3), 120, np.uint8)).save(images / "mine.png")
    rep = report.render_report(tmp_path / "rep", formats=("png",), device="cpu", progress=False,
                               notebooks=[good, broken], model="cifar10-vit", images=images)
    ok, bad = rep.notebooks
    assert ok["ok"] and ok["error"] is None
    assert ok["parameters"]["model_name"] == "cifar10-vit" and ok["parameters"]["images_dir"] == str(images)
    assert sorted(ok["files"]) == ["arrays/toy_line.npz", "figures/toy_line.png", "figures/toy_line.svg"]
    np.testing.assert_array_equal(np.load(rep.out / "arrays" / "toy_line.npz")["y"], [1.0, 0.0])
    page = (rep.out / ok["html"]).read_text()
    assert "data:image/png;base64," in page  # the inline figure is embedded: MPLBACKEND=Agg did not leak in
    assert f"model cifar10-vit images {images}" in page
    assert f"data {tmp_path / 'cifar' / 'test'}" in page
    assert os.environ["VITVIZ_DATA"] == "cifar"  # the report's own environment is restored
    assert "cdnjs" not in page and "<script src=" not in page  # a self-contained page: nothing to fetch
    # the broken notebook: its cell named (index in the source; the count includes the injected parameters cell)
    assert not bad["ok"] and bad["error"]["cell_index"] == 3 and bad["error"]["exec_count"] == 4
    assert bad["error"]["ename"] == "ValueError" and "cell 3" in bad["error"]["message"]
    assert (rep.out / bad["html"]).is_file() and (rep.out / bad["executed"]).is_file()
    assert [f["name"] for f in rep.failures] == ["notebook b_broken.ipynb"]
    assert {"cifar10-vit_pos_embed", "paper_fig5_compute_curves"} <= {f["name"] for f in rep.figures}
    meta = json.loads((rep.out / "meta.json").read_text())
    assert meta["model"] == "cifar10-vit" and meta["images"] == str(images)
    assert [n["name"] for n in meta["notebooks"]] == ["a_good", "b_broken"]
    assert meta["failures"][0]["error"].startswith("b_broken.ipynb: cell 3")
    index = (rep.out / "index.html").read_text()
    assert 'href="notebooks/a_good.html"' in index and 'href="figures/toy_line.png"' in index
    assert "deliberate failure" in index


def test_command_line(tmp_path, capsys):
    out = tmp_path / "rep"
    code = main(["report", "--out", str(out), "--model", "cifar10-vit", "--formats", "png", "--notebooks", "none",
                 "--device", "cpu"])
    assert code == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["model"] == "cifar10-vit" and list(meta["models"]) == ["cifar10-vit"]
    assert meta["settings"]["notebooks"] == []
    assert main(["report", "--out", str(out), "--images", str(tmp_path / "missing"), "--notebooks", "none"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_report_runs_notebook_01_with_figures_and_arrays(tmp_path):
    rep = report.render_report(tmp_path, models=("cifar10-vit",), formats=("png",), device="cpu", progress=False,
                               notebooks=[ROOT / "notebooks" / "01_position_embeddings.ipynb"])
    (nb,) = rep.notebooks
    assert nb["ok"], nb["error"]
    for stem in ("fig7_center_reference", "fig7_left_reference", "fig7_center_timm", "sincos", "interpolated"):
        for fmt in ("png", "pdf", "svg"):
            assert (tmp_path / "figures" / f"{stem}.{fmt}").is_file()
        assert (tmp_path / "arrays" / f"{stem}.npz").is_file()
    assert np.load(tmp_path / "arrays" / "fig7_center_reference.npz")["similarity"].shape == (8, 8, 8, 8)
    assert (tmp_path / nb["html"]).read_text().count("data:image/png;base64,") >= 7


def test_gallery_copies_downscaled_key_figures(tmp_path):
    from PIL import Image

    from vitviz.report import write_gallery

    (tmp_path / "rep" / "figures").mkdir(parents=True)
    Image.new("RGB", (1600, 800), "white").save(tmp_path / "rep" / "figures" / "paper_fig5_compute_curves.png")
    written = write_gallery(tmp_path / "rep", tmp_path / "gallery", width=400)
    assert [p.name for p in written] == ["paper_fig5_compute_curves.png"]  # figures the report lacks are skipped
    with Image.open(written[0]) as im:
        assert im.size == (400, 200)


def test_gallery_takes_only_the_figures_this_report_wrote(tmp_path):
    """A PNG an earlier run left in figures/ (its notebook failed this time) is not copied as if current."""
    from PIL import Image

    from vitviz.report import write_gallery

    figures = tmp_path / "rep" / "figures"
    figures.mkdir(parents=True)
    for name in ("paper_fig5_compute_curves", "fig6_rollout_vit"):
        Image.new("RGB", (40, 20), "white").save(figures / f"{name}.png")
    meta = {"figures": [{"name": "paper_fig5_compute_curves", "files": ["figures/paper_fig5_compute_curves.png"]}],
            "notebooks": [{"name": "02_attention", "ok": False, "files": []}]}
    (tmp_path / "rep" / "meta.json").write_text(json.dumps(meta))
    written = write_gallery(tmp_path / "rep", tmp_path / "gallery")
    assert [p.name for p in written] == ["paper_fig5_compute_curves.png"]
    assert not (tmp_path / "gallery" / "fig6_rollout_vit.png").exists()
    meta["notebooks"][0]["files"] = ["figures/fig6_rollout_vit.png", "arrays/fig6_rollout_vit.npz"]
    (tmp_path / "rep" / "meta.json").write_text(json.dumps(meta))
    written = write_gallery(tmp_path / "rep", tmp_path / "gallery")
    assert [p.name for p in written] == ["fig6_rollout_vit.png", "paper_fig5_compute_curves.png"]



def test_report_study_figure_keeps_training_sets_apart_and_its_arrays_name_every_point(monkeypatch):
    """The measured study in the report is ``plot_study_grid``'s figure (one row of panels per training-set size: seed
    means with intervals, the gap at equal compute; drawn and checked in test_compare), not one compute panel whose
    frontier joins the sizes through the best seed; and each array file says which point is which (family, model,
    seed), readable without pickles."""
    import io

    import pandas as pd
    from conftest import tiny_study_runs
    from matplotlib.figure import Figure

    import vitviz
    import vitviz.experiments.study

    runs = pd.concat([tiny_study_runs(), tiny_study_runs().assign(train_images=1000)], ignore_index=True)
    monkeypatch.setattr(vitviz.experiments.study, "read_results", lambda: runs)
    drawn = []
    for name in ("plot_study_grid", "plot_compute_curves"):  # what each job draws (the figures are tested apart)
        monkeypatch.setattr(vitviz, name, lambda df, *a, name=name, **kw: drawn.append((name, df, kw)) or Figure())
    jobs = dict(report._global_jobs())
    _fig, arrays = jobs["study_hybrid_vs_pure"]()
    ((name, df, _kw),) = drawn
    assert name == "plot_study_grid" and df is runs
    _fig, paper = jobs["paper_fig5_compute_curves"]()
    for got, df in ((arrays, runs), (paper, vitviz.paper_results())):
        buffer = io.BytesIO()
        np.savez(buffer, **got)
        buffer.seek(0)
        with np.load(buffer, allow_pickle=False) as z:
            assert list(z["family"]) == list(df["family"]) and list(z["model"]) == list(df["model"])
            assert list(z["epochs"]) == list(df["epochs"])
    assert list(arrays["seed"]) == list(runs["seed"]) and list(arrays["train_images"]) == list(runs["train_images"])
    np.testing.assert_array_equal(arrays["test_acc"], runs["test_acc"])
    np.testing.assert_array_equal(paper["avg5"], vitviz.paper_results()["avg5"])


def test_the_attention_distance_figure_says_which_images_it_averaged(tmp_path):
    """meta.json, index.html and the arrays name the images behind the distance figure (yours, CIFAR-10 or the
    fallback photographs), not only their count in the title."""
    from conftest import tiny_timm_vit
    from PIL import Image

    folder = tmp_path / "mine"
    folder.mkdir()
    for k in range(3):
        Image.new("RGB", (48, 32), (80 * k, 40, 200)).save(folder / f"img{k}.png")
    rep = report.Report(tmp_path / "rep", formats=("png",))
    m = report.LoadedModel("tiny", tiny_timm_vit(), True)
    from vitviz.zoo.samples import images_from

    listed = images_from(folder, report.DISTANCE_IMAGES)  # as render_report lists --images, once
    (job,) = [fn for name, fn in report._figure_jobs(m, listed) if name == "tiny_attention_distance"]
    report._figure_step(rep, m, "tiny_attention_distance", job)()
    assert not rep.failures
    (entry,) = rep.figures
    assert "3 images" in entry["images"] and str(folder) in entry["images"]
    with np.load(rep.out / "arrays" / "tiny_attention_distance.npz", allow_pickle=False) as z:
        assert [Path(p).name for p in z["images"]] == ["img0.png", "img1.png", "img2.png"]
        assert str(z["image_source"]) == entry["images"] and z["distance_px"].shape == (2, 2)
    from vitviz.report.html import index_html

    meta = {"models": {}, "created": "", "versions": {"vitviz": ""}, "git_commit": None, "device": "cpu"}
    assert f"Images: {entry['images']}" in index_html(rep, meta)


def test_meta_says_when_the_checkout_has_uncommitted_changes(tmp_path, monkeypatch):
    """git_commit names HEAD; a report rendered from a modified checkout says so (git_dirty), or the commit would
    claim code it does not hold."""
    import subprocess

    repo = tmp_path / "repo"
    here = repo / "vitviz" / "report" / "__init__.py"
    here.parent.mkdir(parents=True)
    here.write_text("a = 1\n")

    def git(*args):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=v", "-c", "user.email=v@v", *args], check=True,
                       capture_output=True)

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "one")
    monkeypatch.setattr(report, "__file__", str(here))
    assert report.git_commit() is not None and report.git_dirty() is False
    here.write_text("a = 2\n")
    assert report.git_dirty() is True
    monkeypatch.setattr(report, "__file__", str(tmp_path / "elsewhere" / "__init__.py"))  # no checkout
    assert report.git_commit() is None and report.git_dirty() is None


def test_a_figure_step_that_fails_half_way_closes_its_figure(tmp_path):
    import matplotlib.pyplot as plt

    def half(*_):
        plt.figure()
        raise RuntimeError("drawn, then broke")

    before = set(plt.get_fignums())
    rep = report.Report(tmp_path, formats=("png",))
    report._figure_step(rep, report.LoadedModel("", None, True), "half", half)()
    assert [f["name"] for f in rep.failures] == ["half"] and set(plt.get_fignums()) == before


def test_command_line_refuses_bad_report_options_before_any_figure(tmp_path, capsys, monkeypatch):
    """An ``--out`` that is a file raised NotADirectoryError (a ``--gallery`` one FileExistsError, once the report
    was written); an unknown format or a missing notebook failed each
    figure (or the notebook) in turn after every figure had been computed; ``--cell-timeout -5`` was taken."""
    monkeypatch.setattr(report, "render_report", lambda *a, **k: pytest.fail("render_report ran"))
    file = tmp_path / "a-file"
    file.write_text("")
    for argv, message in ((["--out", str(file)], "--out '" + str(file) + "' is a file; pass a folder"),
                          (["--gallery", str(file)], "--gallery '" + str(file) + "' is a file; pass a folder"),
                          (["--formats", "png,jpgx"], "--formats 'png,jpgx': formats=('png', 'jpgx'): ['jpgx'] not "
                                                      "supported by matplotlib"),
                          (["--notebooks", f"{tmp_path}/missing.ipynb"], "missing.ipynb'] not found or not a notebook "
                                                                         "(.ipynb); pass notebook files"),
                          (["--notebooks", str(file)], f"--notebooks {str(file)!r}: ['{file}'] not found or not a "
                                                       "notebook (.ipynb)"),  # an existing file that is no notebook
                          (["--model", "a", "--model", "b", "--checkpoint", "w.npz"], "--checkpoint 'w.npz' with 2 "
                                                                                      "--model: pass one --checkpoint "
                                                                                      "per --model, in the same order"),
                          (["--checkpoint", "w.npz"], "--checkpoint 'w.npz' with 0 --model"),
                          (["--device", "gpu"], "--device 'gpu': device='gpu' is not a torch device; pass 'auto'"),
                          (["--model", "a", "--checkpoint", "v.npz", "--checkpoint", "w.npz"],
                           "--checkpoint ['v.npz', 'w.npz'] with 1 --model")):
        assert main(["report", "--out", str(tmp_path / "rep"), "--notebooks", "none", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("vitviz: error: --") and message in err and "Traceback" not in err
    assert main(["report", "--out", str(tmp_path / "rep"), "--kernel", "pyhton3"]) == 2  # ran every figure first
    err = capsys.readouterr().err
    assert "vitviz: error: --kernel 'pyhton3' is not a Jupyter kernel here; pass one of ['python3']" in err
    assert "Traceback" not in err
    with pytest.raises(SystemExit) as exit_:
        main(["report", "--cell-timeout", "-5"])
    assert exit_.value.code == 2 and "argument --cell-timeout: -5 is not a positive count" in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()


def test_command_line_checkpoint_goes_to_the_report_and_to_inspect(tmp_path, capsys, monkeypatch):
    """``--model M --checkpoint FILE``: the report gets the file for M; repeated, each ``--checkpoint`` goes with the
    ``--model`` of its place ('none': that model's own weights); ``vitviz inspect M --checkpoint FILE`` reads it (a
    file that does not fit M is refused, so the option is not ignored)."""
    import timm
    import torch

    seen = {}
    monkeypatch.setattr(report, "render_report", lambda *a, **k: seen.update(k, args=a) or report.Report(tmp_path))
    assert main(["report", "--out", str(tmp_path / "rep"), "--notebooks", "none", "--model", "vit_tiny_patch16_224",
                 "--checkpoint", "w.npz"]) == 0
    assert (seen["model"], seen["checkpoint"]) == ("vit_tiny_patch16_224", "w.npz")
    tiny = ["--model", "vit_tiny_patch16_224"]
    assert main(["report", "--out", str(tmp_path / "rep"), "--notebooks", "none", *tiny, "--checkpoint", "a.pth",
                 *tiny, "--checkpoint", "none", "--model", "cifar10-vit", "--checkpoint", "b.pth"]) == 0
    assert seen["args"][1] == ["vit_tiny_patch16_224", "vit_tiny_patch16_224", "cifar10-vit"]
    assert seen["checkpoint"] == ["a.pth", None, "b.pth"] and seen["model"] == "vit_tiny_patch16_224"
    assert main(["report", "--out", str(tmp_path / "rep"), "--notebooks", "none", *tiny, "--checkpoint", "None"]) == 0
    assert seen["checkpoint"] is None
    torch.save(timm.create_model("vit_tiny_patch16_224").state_dict(), tmp_path / "tiny.pth")
    capsys.readouterr()
    assert main(["inspect", "vit_tiny_patch16_224", "--checkpoint", str(tmp_path / "tiny.pth")]) == 0
    assert "ViTSpec(vit_tiny_patch16_224, family=timm)" in capsys.readouterr().out
    assert main(["inspect", "vit_small_patch16_224", "--checkpoint", str(tmp_path / "tiny.pth")]) == 2
    assert "do not fit timm model 'vit_small_patch16_224'" in capsys.readouterr().err


def test_command_line_models_refuses_a_checkpoints_folder_that_is_not_there(tmp_path, capsys):
    """It printed every reference model as untrained and exited 0."""
    assert main(["models", "--checkpoints", str(tmp_path / "typo")]) == 2
    err = capsys.readouterr().err
    assert "vitviz: error: --checkpoints" in err and "typo' is not a folder" in err and "Traceback" not in err


def test_command_line_models_refuses_a_checkpoints_folder_without_cards(tmp_path, capsys):
    """A folder that holds no card (the weights folder's parent, a folder of .safetensors only) printed every
    reference model as untrained and exited 0, as a typo did."""
    (tmp_path / "cifar10-vit.safetensors").write_bytes(b"")
    assert main(["models", "--checkpoints", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert f"vitviz: error: --checkpoints {str(tmp_path)!r} holds no reference card (<model>.json)" in err
    from vitviz.zoo.cards import read_cards

    card = next(iter(read_cards().values()), None)
    if card is None:
        pytest.skip("no shipped card to copy")
    (tmp_path / "mine.json").write_text(json.dumps({**card, "name": "my-vit"}))  # a card of no reference model
    assert main(["models", "--checkpoints", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "holds no reference card (<model>.json)" in err and "cards of other models: ['my-vit']" in err
    (tmp_path / f"{card['name']}.json").write_text(json.dumps(card))
    assert main(["models", "--checkpoints", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert f"| {card['name']} | True |" in out
    assert "note: --checkpoints: cards of models that are no reference model, not listed: ['my-vit']" in err


def _two_step_report(monkeypatch, second: report.Job) -> None:
    """``render_report``'s steps cut to two figures of the README's gallery: a white one, then ``second``."""
    import matplotlib.pyplot as plt

    def white() -> tuple[object, dict[str, np.ndarray]]:
        fig = plt.figure(figsize=(2, 1))
        fig.patch.set_facecolor("white")
        return fig, {"value": np.zeros(1)}

    monkeypatch.setattr(report, "_figure_jobs", lambda m, images=None, distances=None: [])
    monkeypatch.setattr(report, "_global_jobs", lambda: [("paper_fig5_compute_curves", white),
                                                         ("table8_posemb_ablation", second)])


def _render(out: Path) -> report.Report:
    return report.render_report(out, models=("cifar10-vit",), formats=("png",), device="cpu", progress=False,
                                notebooks=())


def test_an_interrupted_report_says_so_and_lists_only_what_it_wrote(tmp_path, monkeypatch):
    """A report stopped part-way (Ctrl-C: a ``KeyboardInterrupt``, which no step catches) leaves a meta.json marked
    ``interrupted`` that lists only this run's figures, not the previous run's meta.json beside new files; its
    index.html says so, and ``write_gallery`` refuses it, naming the folder and the fix."""
    import matplotlib.pyplot as plt

    def black() -> tuple[object, dict[str, np.ndarray]]:
        fig = plt.figure(figsize=(2, 1))
        fig.patch.set_facecolor("black")
        return fig, {"value": np.ones(1)}

    _two_step_report(monkeypatch, black)
    out = tmp_path / "rep"
    _render(out)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "complete"
    assert [f["name"] for f in meta["figures"]] == ["paper_fig5_compute_curves", "table8_posemb_ablation"]
    assert len(report.write_gallery(out, tmp_path / "gallery")) == 2

    def interrupted() -> tuple[object, dict[str, np.ndarray]]:
        raise KeyboardInterrupt

    _two_step_report(monkeypatch, interrupted)
    with pytest.raises(KeyboardInterrupt):
        _render(out)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "interrupted"
    assert [f["name"] for f in meta["figures"]] == ["paper_fig5_compute_curves"]
    assert meta["notebooks"] == [] and meta["failures"] == []
    assert meta["models"]["cifar10-vit"]["name"] == "cifar10-vit" and meta["settings"]["formats"] == ["png"]
    page = (out / "index.html").read_text()
    assert "interrupted" in page and "table8_posemb_ablation" not in page and page.count("<img") == 1
    with pytest.raises(InputError, match=r"(?s)rep.*status 'interrupted'.*render it again"):
        report.write_gallery(out, tmp_path / "gallery2")
    assert not (tmp_path / "gallery2").exists()


def test_a_report_being_rendered_says_so_before_its_first_step_and_after_each(tmp_path, monkeypatch):
    """meta.json and index.html are replaced before the first step (a run killed outright, ``kill -9`` or a job's
    time limit, must not leave the previous run's beside new figures) and rewritten after each step: while the
    second step runs they say ``running`` and list the first step's figure only; ``write_gallery`` refuses them."""
    import matplotlib.pyplot as plt

    out = tmp_path / "rep"
    (out / "figures").mkdir(parents=True)
    old = {"status": "complete", "figures": [{"name": "table8_posemb_ablation",
                                              "files": ["figures/table8_posemb_ablation.png"]}], "notebooks": []}
    (out / "meta.json").write_text(json.dumps(old))
    (out / "index.html").write_text("<html>the previous run's index</html>")
    seen: list[tuple[dict, str]] = []

    def second() -> tuple[object, dict[str, np.ndarray]]:
        seen.append((json.loads((out / "meta.json").read_text()), (out / "index.html").read_text()))
        with pytest.raises(InputError, match="status 'running'"):
            report.write_gallery(out, tmp_path / "gallery")
        return plt.figure(figsize=(2, 1)), {"value": np.ones(1)}

    _two_step_report(monkeypatch, second)
    _render(out)
    ((meta, page),) = seen
    assert meta["status"] == "running"
    assert [f["name"] for f in meta["figures"]] == ["paper_fig5_compute_curves"] and meta["failures"] == []
    assert "previous run" not in page and "being rendered" in page and page.count("<img") == 1
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "complete" and len(meta["figures"]) == 2
    assert "Status:" not in (out / "index.html").read_text()


def test_gallery_refuses_a_report_that_is_not_complete(tmp_path):
    figures = tmp_path / "rep" / "figures"
    figures.mkdir(parents=True)
    Image.new("RGB", (40, 20), "white").save(figures / "paper_fig5_compute_curves.png")
    meta = {"status": "running", "notebooks": [],
            "figures": [{"name": "paper_fig5_compute_curves", "files": ["figures/paper_fig5_compute_curves.png"]}]}
    (tmp_path / "rep" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match=r"(?s)report_out=.*rep.*status 'running'.*render it again"):
        report.write_gallery(tmp_path / "rep", tmp_path / "gallery")
    meta["status"] = "complete"
    (tmp_path / "rep" / "meta.json").write_text(json.dumps(meta))
    assert [p.name for p in report.write_gallery(tmp_path / "rep", tmp_path / "gallery")] == [
        "paper_fig5_compute_curves.png"]


@pytest.mark.slow  # calls render_report with notebooks (refused first; were that lost, they would run)
def test_a_rerun_starts_clean_and_never_shows_an_earlier_runs_files(tmp_path, monkeypatch):
    """A rerun into a report folder left ``figures/``, ``arrays/`` and ``notebooks/`` of the earlier run in place: a
    figure that failed this time (or a file a killed run wrote before its meta.json listed it) stayed beside the new
    ones, as if current. Now the earlier report's three folders are emptied before the first step (only once the
    models loaded: a refused rerun keeps the earlier report whole); a folder whose ``figures/`` holds files that no
    vitviz report wrote (no meta.json) is refused, naming it, and nothing in it is touched."""
    import matplotlib.pyplot as plt

    def black() -> tuple[object, dict[str, np.ndarray]]:
        return plt.figure(figsize=(2, 1)), {"value": np.ones(1)}

    _two_step_report(monkeypatch, black)
    out = tmp_path / "rep"
    _render(out)
    (out / "figures" / "killed_step.png").write_bytes(b"written by a run killed before meta.json listed it")

    def broken() -> tuple[object, dict[str, np.ndarray]]:
        raise RuntimeError("fails this time")

    _two_step_report(monkeypatch, broken)
    with pytest.raises(FileNotFoundError, match="is not a file"):  # refused before anything is touched
        report.render_report(out, models=("cifar10-vit",), model="cifar10-vit", checkpoint=tmp_path / "typo.pth",
                             formats=("png",), device="cpu", progress=False, notebooks=())
    assert (out / "figures" / "table8_posemb_ablation.png").is_file()
    rep = _render(out)
    assert [f["name"] for f in rep.failures] == ["table8_posemb_ablation"]
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["paper_fig5_compute_curves.png"]
    assert sorted(p.name for p in (out / "arrays").iterdir()) == ["paper_fig5_compute_curves.npz"]
    executed = write_notebook(out / "notebooks" / "mine.ipynb", "x = 1")  # an input the emptying would delete
    with pytest.raises(InputError, match=r"mine.ipynb' lies in .*notebooks', which the report empties"):
        report.render_report(out, models=("cifar10-vit",), formats=("png",), device="cpu", progress=False,
                             notebooks=[executed])
    assert executed.is_file()

    stranger = tmp_path / "mine"
    (stranger / "figures").mkdir(parents=True)
    (stranger / "figures" / "holiday.png").write_bytes(b"not vitviz's")
    with pytest.raises(InputError, match=r"(?s)out='.*mine'.*figures.*holiday.png.*no vitviz report wrote.*new or empty folder"):
        _render(stranger)
    assert (stranger / "figures" / "holiday.png").read_bytes() == b"not vitviz's"
    assert not (stranger / "meta.json").exists()


def test_a_setting_a_notebook_does_not_take_is_said_in_the_index_and_on_the_command_line(tmp_path, monkeypatch,
                                                                                         capsys):
    """``--model``/``--images`` went silently unused by a notebook that declares no parameter for them (notebook 05
    takes neither, 01 no images): its figures, drawn on its own defaults, sat beside the others as if of your model.
    Each notebook's entry now lists what it did not take; the index and the command line say so, and with several
    ``--model`` that the notebooks ran on the first only."""
    import vitviz.report.notebooks as notebooks
    from vitviz.report.html import index_html

    monkeypatch.setattr(notebooks, "run_notebook", lambda path, out, params, **kw: notebooks.NotebookRun(
        Path(path).stem, str(path), dict(params), ok=True))
    own = write_notebook(tmp_path / "own.ipynb", "out_dir = None")
    takes = write_notebook(tmp_path / "takes.ipynb", 'out_dir = None\nmodel_name = "m"\ndata_dir = None')
    rep = report.Report(tmp_path / "rep")
    settings = {"out_dir": tmp_path, "arrays_dir": None, "model": "vit_tiny_patch16_224", "checkpoint": None,
                "images": tmp_path / "imgs"}
    for nb in (own, takes):
        report._notebook_step(rep, nb, settings, "python3", None)()
    assert [nb["not_taken"] for nb in rep.notebooks] == [
        {"model": "vit_tiny_patch16_224", "images": str(tmp_path / "imgs")}, {}]
    models = {"a": {"spec": "", "name": "vit_tiny_patch16_224", "checkpoint": "/w/a.pth"},
              "b": {"spec": "", "name": "vit_tiny_patch16_224", "checkpoint": None}}
    meta = {"models": models, "model": "vit_tiny_patch16_224", "checkpoint": "/w/a.pth", "created": "",
            "versions": {"vitviz": ""}, "git_commit": None, "device": "cpu"}
    page = index_html(rep, meta)
    assert page.count("takes no") == 2 and "takes no model: ran on its own, not vit_tiny_patch16_224" in page
    assert "they ran on vit_tiny_patch16_224 only, not on the package figures' other models (b)" in page
    # no model given (make report): each notebook ran on its own reference models, not on "None"
    default = index_html(rep, {**meta, "model": None, "checkpoint": None})
    assert "take one model" not in default and "ran on None" not in default
    monkeypatch.setattr(report, "render_report", lambda *a, **k: rep)
    assert main(["report", "--out", str(tmp_path / "rep"), "--model", "vit_tiny_patch16_224", "--model", "x"]) == 0
    out = capsys.readouterr().out
    assert "note: notebook own takes no model: it ran on its own, not --model 'vit_tiny_patch16_224'" in out
    assert "note: notebook own takes no images" in out and "note: notebook takes" not in out
    assert "they ran on the first --model, 'vit_tiny_patch16_224', only" in out


@pytest.mark.slow  # calls render_report with notebooks (refused first; were that lost, they would run)
def test_two_notebooks_of_one_name_are_refused_before_anything_is_written(tmp_path):
    """Both were executed into ``notebooks/<name>.ipynb`` and ``.html``: the second overwrote the first, whose entry
    in the index then linked the second's page as its own."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        write_notebook(tmp_path / folder / "same.ipynb", "out_dir = None")
    with pytest.raises(InputError, match=r"notebooks= holds two notebooks named 'same'.*a/same.ipynb.*b/same.ipynb"):
        report.render_report(tmp_path / "rep", models=("cifar10-vit",), progress=False,
                             notebooks=[tmp_path / "a" / "same.ipynb", tmp_path / "b" / "same.ipynb"])
    assert not (tmp_path / "rep").exists()


def test_a_notebook_that_fails_before_it_runs_is_not_shown_by_an_earlier_runs_pages(tmp_path):
    """``run_notebook`` into a folder holding an earlier run's ``<name>.ipynb``: where papermill failed before it
    wrote anything (an unreadable notebook, a kernel that does not start), the earlier run's executed notebook was
    taken for this run's (``executed`` set, its HTML made again from it). Now it is removed first."""
    from vitviz.report.notebooks import run_notebook

    out = tmp_path / "out"
    out.mkdir()
    write_notebook(out / "nb.ipynb", "x = 1", "print('an earlier run')")  # the earlier run's executed notebook
    (out / "nb.html").write_text("<html>an earlier run</html>")
    broken = tmp_path / "nb.ipynb"
    broken.write_text("{ not a notebook")
    run = run_notebook(broken, out, {})
    assert not run.ok and run.error["message"].startswith("nb.ipynb: ")
    assert run.executed is None and run.html is None
    assert not (out / "nb.ipynb").exists() and not (out / "nb.html").exists()
    with pytest.raises(InputError, match="is the folder of nb.ipynb: its executed copy would replace it"):
        run_notebook(broken, tmp_path, {})
    assert broken.read_text() == "{ not a notebook"


def test_render_report_refuses_missing_images_before_anything_is_computed(tmp_path):
    """``render_report(images=<a typo>)`` computed every model's figures, failed each figure that shows images in
    turn and passed the missing folder to every notebook; it is refused first, as ``vitviz report --images`` is."""
    with pytest.raises(FileNotFoundError, match="typo"):
        report.render_report(tmp_path / "rep", models=("cifar10-vit",), progress=False, notebooks=(),
                             images=tmp_path / "typo")
    assert not (tmp_path / "rep").exists()


def test_a_notebook_flag_or_count_of_the_wrong_kind_is_refused_naming_it():
    """papermill passes a raw parameter (``-r with_flow False``) as the string ``'False'``, which reads as True."""
    from vitviz.errors import InputTypeError
    from vitviz.report.notebooks import check_parameter

    assert check_parameter("with_flow", False, bool) is False and check_parameter("with_flow", True, bool) is True
    assert check_parameter("n_images", 12, int) == 12 and check_parameter("lr", 0.5, float) == 0.5
    for value in ("False", "no", None, 2):
        with pytest.raises(InputTypeError, match=rf"with_flow={value!r} is not a bool; pass True or False \(the "
                                                 r"notebook's with_flow parameter; papermill -p and -y pass it typed"):
            check_parameter("with_flow", value, bool)
    for value in ("128", True, 12.5):
        with pytest.raises(InputTypeError, match=rf"n_images={value!r} is not an int; pass a whole number"):
            check_parameter("n_images", value, int)
    with pytest.raises(InputTypeError, match=r"lr='0.5' is not a number"):
        check_parameter("lr", "0.5", float)


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).parents[1] / "notebooks").glob("*.ipynb")))
def test_every_flag_and_count_of_a_shipped_notebook_is_checked_before_it_is_used(name):
    """Each parameter whose default is a bool, an int, a float or a list is read through ``check_parameter`` in the
    first code cell after the parameters cell, before that cell does anything else; given as a string, that cell
    refuses it."""
    import ast

    from vitviz.errors import InputTypeError
    from vitviz.report.notebooks import _declared_kind, notebook_parameters

    path = Path(__file__).parents[1] / "notebooks" / name
    kinds = {k: kind for k, d in notebook_parameters(path).items() if (kind := _declared_kind(d)) is not None}
    cells = nbformat.read(path, as_version=4).cells
    first = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
    cell = next(c for c in cells[first + 1:] if c.cell_type == "code")
    body = ast.parse(cell.source).body
    imports = [s for s in body if isinstance(s, (ast.Import, ast.ImportFrom))]
    rest = [s for s in body if s not in imports]
    checks = [s for s in rest[:len(kinds)] if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call)
              and getattr(s.value.func, "id", "") == "check_parameter"]
    assert {s.targets[0].id for s in checks} == set(kinds), "flags and counts not read through check_parameter first"
    code = compile(ast.Module([*imports, *checks], []), name, "exec")
    examples = {bool: False, int: 1, float: 1.0, list[int]: [1], list[float]: [1.0], list[str]: ["a"], list: []}
    good = {k: examples[kind] for k, kind in kinds.items()}
    exec(code, dict(good))  # noqa: S102
    for k in kinds:
        with pytest.raises(InputTypeError, match=rf"{k}='False' is not"):
            exec(code, {**good, k: "False"})  # noqa: S102


def test_a_notebook_list_parameter_is_refused_unless_a_list_of_its_kind():
    """papermill -r passes ``shots`` as ``'[1, 5]'`` or ``'5'``, which notebook 05 iterated character by character
    (``model_names='cifar10-vit'`` loaded a model named ``'c'``); a list, of the default's element kind, is asked."""
    from vitviz.errors import InputTypeError
    from vitviz.report.notebooks import _declared_kind, check_parameter

    assert _declared_kind("[1, 5, 10]") == list[int] and _declared_kind('["a", "b"]') == list[str]
    assert _declared_kind("[0.5]") == list[float] and _declared_kind("[]") is list and _declared_kind('[1, "a"]') is list
    assert check_parameter("shots", [1, 5], list[int]) == [1, 5] and check_parameter("shots", [], list[int]) == []
    assert check_parameter("model_names", ["a"], list[str]) == ["a"] and check_parameter("x", [1, "a"], list) == [1, "a"]
    for value in ("[1, 5]", "5", 5, (1, 5), None):
        with pytest.raises(InputTypeError, match=rf"^shots={re.escape(repr(value))} is not a list; pass a list of whole "
                                                 r"numbers, e.g. \[1, 5\] \(papermill -y 'shots: \[1, 5\]'\)"):
            check_parameter("shots", value, list[int])
    for value, bad in (([1, "5"], "'5'"), ([1, True], "True"), ([1, 2.5], "2.5")):
        with pytest.raises(InputTypeError, match=rf"^shots={re.escape(repr(value))} holds {bad}, which is not a whole "
                                                 r"number; pass a list of whole numbers"):
            check_parameter("shots", value, list[int])
    with pytest.raises(InputTypeError, match=r"^model_names='cifar10-vit' is not a list; pass a list of strings"):
        check_parameter("model_names", "cifar10-vit", list[str])
    with pytest.raises(InputTypeError, match=r"^model_names=\['a', 1\] holds 1, which is not a string"):
        check_parameter("model_names", ["a", 1], list[str])
    with pytest.raises(InputTypeError, match=r"^x='\[\]' is not a list"):
        check_parameter("x", "[]", list)


def test_a_notebook_choice_is_refused_unless_one_of_its_choices():
    from vitviz.errors import InputError
    from vitviz.report.notebooks import check_parameter

    assert check_parameter("interval", "bootstrap", ("t", "bootstrap")) == "bootstrap"
    for value in ("T", "", None, ["t"]):
        with pytest.raises(InputError, match=rf"^interval={re.escape(repr(value))} is not one of \['t', 'bootstrap'\]; "
                                             r"pass one of them \(the notebook's interval parameter\)"):
            check_parameter("interval", value, ("t", "bootstrap"))
    with pytest.raises(InputError, match=r"^k=True is not one of \[1, 2\]"):  # True == 1, but not the choice 1
        check_parameter("k", True, (1, 2))


def test_notebook_04_refuses_an_interval_or_a_baseline_before_the_perturbation_runs():
    """``interval`` reached faithfulness_auc and ``baseline`` compare_methods only after vitviz.faithfulness had run
    every method on every image (the notebook's long cell): ``interval="T"`` or ``baseline="Chefer"`` failed there.
    The setup cell checks both, before the perturbation runs: interval before the model loads, the baseline once
    the methods it will run are known."""
    import ast

    from vitviz.errors import InputError

    path = Path(__file__).parents[1] / "notebooks" / "04_faithfulness.ipynb"
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    setup = next(i for i, c in enumerate(cells) if "check_parameter(" in c.source)
    assert all("vitviz.faithfulness(" not in c.source for c in cells[:setup + 1])
    body = ast.parse(cells[setup].source).body
    imports = [s for s in body if isinstance(s, (ast.Import, ast.ImportFrom))]
    checks = {s.targets[0].id: s for s in body if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call)
              and getattr(s.value.func, "id", "") == "check_parameter"}

    def run(name, **env):
        exec(compile(ast.Module([*imports, checks[name]], []), path.name, "exec"), env)  # noqa: S102
        return env[name]

    assert run("interval", interval="bootstrap") == "bootstrap"
    with pytest.raises(InputError, match=r"interval='T' is not one of \['t', 'bootstrap'\]"):
        run("interval", interval="T")
    assert run("baseline", baseline="rollout", methods=["chefer", "rollout"]) == "rollout"
    with pytest.raises(InputError, match=r"baseline='Chefer' is not one of \['chefer', 'rollout'\]"):
        run("baseline", baseline="Chefer", methods=["chefer", "rollout"])
    model_line = next(s.lineno for s in body if "load_model" in ast.unparse(s))
    assert checks["interval"].lineno < model_line  # before the model loads; the baseline once methods are known


def test_run_notebook_refuses_a_flag_given_as_a_string_before_anything_runs(tmp_path):
    from vitviz.errors import InputTypeError
    from vitviz.report.notebooks import run_notebook

    nb = write_notebook(tmp_path / "a.ipynb", 'with_flow = False\nn_images = 3\nmodel_name = "cifar10-vit"\n'
                        'shots = [1, 5]\nmodel_names = ["cifar10-vit"]', "raise SystemExit('must not run')")
    with pytest.raises(InputTypeError, match=r"with_flow='False' is not a bool; pass True or False"):
        run_notebook(nb, tmp_path / "out", {"with_flow": "False", "model_name": "any string"})
    with pytest.raises(InputTypeError, match=r"n_images='3' is not an int"):
        run_notebook(nb, tmp_path / "out", {"n_images": "3"})
    with pytest.raises(InputTypeError, match=r"shots='\[1, 5\]' is not a list; pass a list of whole numbers"):
        run_notebook(nb, tmp_path / "out", {"shots": "[1, 5]"})
    with pytest.raises(InputTypeError, match=r"model_names=\['cifar10-vit', 5\] holds 5, which is not a string"):
        run_notebook(nb, tmp_path / "out", {"model_names": ["cifar10-vit", 5]})
    assert not (tmp_path / "out").exists()  # refused before the folder, the kernel or papermill's copy


def test_command_line_checkpoint_none_means_the_models_own_weights_for_every_command(tmp_path, capsys, monkeypatch):
    """``--checkpoint none`` was the model's own weights for ``vitviz report`` but a missing file for ``vitviz
    inspect``: one rule (``checkpoint_arg``) reads the option for every command."""
    import vitviz

    seen = []
    load = vitviz.load_model
    monkeypatch.setattr(vitviz, "load_model", lambda *a, **k: seen.append(k["checkpoint"]) or load(*a, **k))
    for text in ("none", "None", "NONE"):
        capsys.readouterr()
        assert main(["inspect", "vit_tiny_patch16_224", "--checkpoint", text]) == 0
        assert "ViTSpec(vit_tiny_patch16_224, family=timm)" in capsys.readouterr().out
    assert main(["inspect", "vit_tiny_patch16_224"]) == 0
    assert seen == [None] * 4
    assert main(["inspect", "vit_tiny_patch16_224", "--checkpoint", str(tmp_path / "none.pth")]) == 2  # a file: read
    assert "none.pth" in capsys.readouterr().err
