"""Reports with your own images (a flat folder, a class-folder tree, one file) and byte-identical re-renders."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitviz
from vitviz.__main__ import main
from vitviz.zoo.samples import example_images, images_from

ROOT = Path(__file__).resolve().parents[1]


def picture(path: Path, seed: int, size: tuple[int, int] = (40, 48)) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("layouts")
    flat = root / "flat"
    flat.mkdir()
    for i, name in enumerate(["c.webp", "a.jpg", "b.png", "d.JPEG"]):
        picture(flat / name, i)
    (flat / "notes.txt").write_text("not an image")
    (flat / "empty").mkdir()
    tree = root / "tree"
    for c, n in (("cat", 3), ("dog", 2)):
        (tree / c).mkdir(parents=True)
        for i in range(n):
            picture(tree / c / f"{i}.png", 10 * len(c) + i)
    single = picture(root / "one.png", 99, (64, 40))
    return {"flat": flat, "tree": tree, "file": single}


def test_images_from_reads_each_layout(layouts):
    flat = images_from(layouts["flat"])
    assert [p.name for p in flat.images] == ["a.jpg", "b.png", "c.webp", "d.JPEG"]  # sorted by name, any suffix
    assert flat.labels == ["a", "b", "c", "d"] and "flat folder" in flat.source
    tree = images_from(layouts["tree"])
    assert tree.labels == ["cat", "dog", "cat", "dog", "cat"]  # taken in turn from each class
    assert images_from(layouts["tree"], 3).labels == ["cat", "dog", "cat"]
    single = images_from(layouts["file"])
    assert single.images == [layouts["file"]] and single.labels == ["one"]
    assert [p.name for p in example_images(layouts["flat"], 2).images] == ["a.jpg", "b.png"]
    with pytest.raises(FileNotFoundError, match="no images in"):
        images_from(layouts["flat"] / "empty")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        images_from(layouts["flat"] / "missing")
    with pytest.raises(FileNotFoundError, match="not an image file"):
        images_from(layouts["flat"] / "notes.txt")


def test_a_count_of_images_that_is_not_positive_is_refused(layouts):
    """n=0 gave no images and n=-1 all but the last, without a word."""
    from vitviz.errors import InputError

    for n in (0, -1, 2.0, True):
        for call, where in ((images_from, "flat"), (images_from, "tree"), (example_images, "flat")):
            with pytest.raises(InputError, match=rf"n={n!r} must be a positive int, the number of images"):
                call(layouts[where], n)


@pytest.mark.parametrize("layout", ["flat", "tree", "file"])
def test_report_uses_your_images_in_the_package_figures(layouts, layout, tmp_path, capsys):
    out = tmp_path / "rep"
    code = main(["report", "--out", str(out), "--model", "cifar10-vit", "--formats", "png", "--notebooks", "none",
                 "--device", "cpu", "--images", str(layouts[layout])])
    assert code == 0, capsys.readouterr().err
    meta = json.loads((out / "meta.json").read_text())
    assert meta["images"] == str(layouts[layout].resolve()) and not meta["failures"]
    got = np.load(out / "arrays" / "cifar10-vit_attention_distance.npz")["distance_px"]
    model = vitviz.load_model_or_random("cifar10-vit")
    want = vitviz.mean_attention_distance(model, images_from(layouts[layout]).images).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_save_figure_gives_identical_bytes_twice(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def render(folder: Path) -> list[Path]:
        fig, ax = plt.subplots()
        ax.imshow(np.arange(12.0).reshape(3, 4))
        ax.plot([0, 1], [1, 0], label="line")
        ax.legend()
        fig.colorbar(ax.images[0], label="value")
        paths = vitviz.save_figure(fig, folder / "fig", formats=("png", "pdf", "svg"))
        plt.close(fig)
        return paths

    first = render(tmp_path / "a")
    time.sleep(1.1)  # a creation date with one-second resolution would differ now
    second = render(tmp_path / "b")
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes(), f"{a.suffix} differs between two renders"
    assert b"CreationDate" not in first[1].read_bytes() and b"<dc:date>" not in first[2].read_bytes()


def test_report_package_figures_are_byte_identical_twice(tmp_path):
    from vitviz.report import render_report, write_gallery

    outs = []
    for run in ("a", "b"):
        rep = render_report(tmp_path / run, models=("cifar10-vit",), formats=("png", "pdf", "svg"), device="cpu",
                            progress=False, notebooks=())
        assert not rep.failures
        write_gallery(rep.out, tmp_path / f"gallery_{run}")
        outs.append(rep.out)
    files = sorted(p.relative_to(outs[0]) for p in (outs[0] / "figures").iterdir())
    assert files
    for rel in files:
        assert (outs[0] / rel).read_bytes() == (outs[1] / rel).read_bytes(), f"{rel} differs"
    for p in (tmp_path / "gallery_a").iterdir():
        assert p.read_bytes() == (tmp_path / "gallery_b" / p.name).read_bytes(), f"gallery {p.name} differs"


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_notebook_02_runs_on_a_flat_folder(layouts, tmp_path):
    from vitviz.report import render_report

    rep = render_report(tmp_path, models=(), formats=("png",), device="cpu", progress=False,
                        notebooks=[ROOT / "notebooks" / "02_attention.ipynb"], images=layouts["flat"])
    (nb,) = rep.notebooks
    assert nb["ok"], nb["error"]
    assert np.load(tmp_path / "arrays" / "fig6_rollout_vit.npz")["rollout"].shape[0] == 4  # the folder's 4 images


def test_gallery_keeps_a_png_that_differs_by_rendering_noise_only(tmp_path):
    from vitviz.report import write_gallery

    figures = tmp_path / "rep" / "figures"
    figures.mkdir(parents=True)
    rng = np.random.default_rng(0)
    base = rng.integers(0, 250, (100, 200, 3), dtype=np.uint8)
    Image.fromarray(base).save(figures / "fig6_rollout_vit.png")
    (target,) = write_gallery(tmp_path / "rep", tmp_path / "gallery")
    original = target.read_bytes()
    noisy = base.copy()
    noisy[50, 60:66] += 2  # six pixels two levels off, as float noise in a colormap gives
    Image.fromarray(noisy).save(figures / "fig6_rollout_vit.png")
    write_gallery(tmp_path / "rep", tmp_path / "gallery")
    assert target.read_bytes() == original
    changed = base.copy()
    changed[:, :20] = 255  # a real change
    Image.fromarray(changed).save(figures / "fig6_rollout_vit.png")
    write_gallery(tmp_path / "rep", tmp_path / "gallery")
    assert target.read_bytes() != original
    with Image.open(target) as im:
        assert (np.asarray(im)[:, :20] == 255).all()


def test_a_figure_that_fails_while_written_leaves_the_previous_file_whole(tmp_path):
    """matplotlib opens an SVG or PDF file before it draws into it: an interrupt during that draw (Ctrl-C on a
    large figure) must leave the previous file whole, not a truncated one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.artist import Artist

    class Interrupted(Artist):
        """Lets the tight-bbox pass draw it, then interrupts the draw into the file."""

        draws = 0

        def draw(self, renderer):
            self.draws += 1
            if self.draws % 2 == 0:
                raise KeyboardInterrupt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    old = {p: p.read_bytes() for p in vitviz.save_figure(fig, tmp_path / "fig", formats=("svg", "pdf", "png"))}
    ax.add_artist(Interrupted())
    for fmt in ("svg", "pdf", "png"):
        with pytest.raises(KeyboardInterrupt):
            vitviz.save_figure(fig, tmp_path / "fig", formats=(fmt,))
    plt.close(fig)
    assert {p: p.read_bytes() for p in old} == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.pdf", "fig.png", "fig.svg"]  # no temporary file left


def test_image_set_head_refuses_a_count_that_is_no_positive_int():
    """``ImageSet.head(n)`` sliced: ``head(-1)`` (notebook 04's ``n_show = -1``) gave every image but the last,
    ``head(0)`` none (an empty figure further on), ``head(2.5)`` a bare TypeError."""
    from vitviz.errors import InputError
    from vitviz.zoo.samples import ImageSet

    images = ImageSet([np.zeros((4, 4, 3), np.uint8)] * 3, ["a", "b", "c"], "three images")
    assert images.head(2).labels == ["a", "b"] and images.head(5).labels == ["a", "b", "c"]
    for n in (0, -1, 2.5, True):
        with pytest.raises(InputError, match=rf"n={n!r} must be a positive int, the number of images to keep"):
            images.head(n)


def test_render_report_lists_your_images_once(layouts, tmp_path, monkeypatch):
    """The folder was listed by the check before the first step and again by every model's attention-distance
    figure; it is listed once, and every figure averages over that one listing."""
    import vitviz.report as report
    import vitviz.zoo.samples as samples

    listed = []
    real = samples.images_from
    monkeypatch.setattr(samples, "images_from", lambda path, n=None: listed.append(Path(path)) or real(path, n))
    monkeypatch.setattr(report, "_global_jobs", lambda: [])  # the paper's figures list no images
    rep = report.render_report(tmp_path / "rep", models=("cifar10-vit", "cifar10-hybrid"), formats=("png",),
                               device="cpu", progress=False, notebooks=(), images=layouts["flat"])
    assert not rep.failures and [p.resolve() for p in listed] == [layouts["flat"].resolve()]
    for key in ("cifar10-vit", "cifar10-hybrid"):
        names = np.load(tmp_path / "rep" / "arrays" / f"{key}_attention_distance.npz")["images"]
        assert [Path(n).name for n in names] == ["a.jpg", "b.png", "c.webp", "d.JPEG"]


def test_the_command_line_names_the_images_it_uses_once(layouts, tmp_path, capsys, monkeypatch):
    """``vitviz report --images DIR`` listed the folder itself and printed that listing ("4 images from DIR"),
    and render_report listed it again, DISTANCE_IMAGES of them, for the figures: with more images than that the
    line named a count the figures did not use. The images are named once, as the figures' own listing."""
    from vitviz import report

    monkeypatch.setattr(report, "DISTANCE_IMAGES", 3)  # fewer than the flat folder's 4
    out = tmp_path / "rep"
    code = main(["report", "--out", str(out), "--model", "cifar10-vit", "--formats", "png", "--notebooks", "none",
                 "--device", "cpu", "--images", str(layouts["flat"])])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    (source,) = [f["images"] for f in json.loads((out / "meta.json").read_text())["figures"] if "images" in f]
    assert source.startswith("3 images from ")
    both = printed.out + printed.err
    assert both.count(source) == 1 and both.count(str(layouts["flat"])) == 1, both
