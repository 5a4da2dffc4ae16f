"""Command line: ``python -m vitviz {report,inspect,models,train,study} ...`` (also the ``vitviz`` script).

Nothing here imports torch before a command runs, so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vitviz.core.util import cli_errors
from vitviz.errors import DataNotFoundError, InputError
from vitviz.experiments.config import positive_int


def checkpoint_arg(text: str) -> str | None:
    """An argparse ``type``, the one rule for every command's ``--checkpoint``: ``none`` (any case) is the model's
    own weights (``None``), anything else a weights file."""
    return None if text.strip().lower() == "none" else text


@cli_errors("vitviz")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["train"], ["study"]):  # their parsers import no torch, so --help answers at once
        from vitviz.experiments.config import study_parser, train_parser

        if argv[0] == "train":
            args = train_parser("vitviz train").parse_args(argv[1:])
            from vitviz.experiments.train import run_from_args

            return run_from_args(args)
        study_parser("vitviz study").parse_args(argv[1:])  # validates (and answers --help) before torch loads
        from vitviz.experiments.study import main as study_main

        return study_main(argv[1:])
    p = argparse.ArgumentParser(prog="vitviz", description="Vision Transformer analysis and figures.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report", help="execute the notebooks and render every figure (offline by default)")
    r.add_argument("--out", default="reports", help="output folder (default: reports)")
    r.add_argument("--model", action="append", metavar="NAME_OR_PATH",
                   help="what vitviz.load_model takes: a timm or reference model name, a weights file, a model "
                        "folder or a Hub id (repeatable): the package figures use each, the notebooks get the first "
                        "as model_name (default: the reference models, the notebooks' defaults); a notebook without "
                        "a model parameter keeps its own models, said in the index and on exit")
    r.add_argument("--checkpoint", action="append", metavar="FILE", type=checkpoint_arg,
                   help="a weights file for --model's architecture: a .safetensors, .pth/.pt/.bin or the original "
                        "JAX .npz, e.g. --model vit_base_patch16_224 --checkpoint ViT-B_16.npz; used by the package "
                        "figures and, for the first --model, the notebooks. Repeatable, one per --model in the same "
                        "order ('none': that model's own weights), to compare checkpoints: --model vit_tiny_patch16_224 --checkpoint "
                        "a.pth --model vit_tiny_patch16_224 --checkpoint b.pth")
    r.add_argument("--images", metavar="DIR",
                   help="your images for every figure that shows images (the notebooks' data_dir and the package "
                        "figures): one image file, a flat folder (jpg/jpeg/png/webp/bmp, sorted by name) or "
                        "<class>/<image> subfolders; a notebook without an image parameter keeps its own images, "
                        "said in the index and on exit")
    r.add_argument("--notebooks", default=None, metavar="FILES",
                   help="comma-separated notebooks to execute (default: the installed ones, vitviz.notebooks, built "
                        "from the repository's notebooks/; 'none' for none)")
    r.add_argument("--formats", default="png,pdf,svg", help="comma-separated formats of the package figures")
    r.add_argument("--device", default="auto", help="device of the package figures' models: auto (CUDA when "
                                                    "available, the default), cpu, cuda, cuda:1, mps")
    r.add_argument("--kernel", default="python3", help="Jupyter kernel for the notebooks (default: python3)")
    r.add_argument("--cell-timeout", type=positive_int, default=1800, help="seconds a notebook cell may run")
    r.add_argument("--gallery", metavar="DIR", help="also write the key figures, downscaled, to DIR (README gallery)")
    i = sub.add_parser("inspect", help="print the token layout of a model")
    i.add_argument("model", help="a timm or reference model name, a weights file, a model folder or a Hub id "
                                 "(what vitviz.load_model takes)")
    i.add_argument("--checkpoint", metavar="FILE", type=checkpoint_arg,
                   help="a weights file for the model's architecture ('none': the model's own weights)")
    m = sub.add_parser("models", help="the reference models: what each card says, and the position-embedding "
                                      "ablation beside the paper's Table 8")
    m.add_argument("--checkpoints", metavar="DIR", help="folder of the cards (default: vitviz/zoo/checkpoints)")
    sub.add_parser("train", help="train a reference model (vitviz train --help)")
    sub.add_parser("study", help="run the hybrid-versus-pure study (vitviz study --help)")
    a = p.parse_args(argv)
    if a.cmd == "models":
        from vitviz.zoo.cards import markdown_table, posemb_ablation_results, read_cards, reference_table

        if a.checkpoints is not None and not Path(a.checkpoints).is_dir():  # it would list every model untrained
            raise DataNotFoundError(f"--checkpoints {a.checkpoints!r} is not a folder; pass the folder of the "
                                    "reference cards (<model>.json), or leave it out for vitviz/zoo/checkpoints")
        if a.checkpoints is not None:  # as would a folder without a card of a reference model
            from vitviz.zoo.reference import REFERENCE_MODELS

            cards = read_cards(a.checkpoints)
            other = sorted(set(cards) - set(REFERENCE_MODELS))
            if len(other) == len(cards):
                found = f" (cards of other models: {other})" if other else ""
                raise DataNotFoundError(f"--checkpoints {a.checkpoints!r} holds no reference card (<model>.json)"
                                        f"{found}; pass the folder the cards were exported to, or leave it out for "
                                        "vitviz/zoo/checkpoints")
            if other:
                print(f"vitviz: note: --checkpoints: cards of models that are no reference model, not listed: {other}",
                      file=sys.stderr)

        print(markdown_table(reference_table(a.checkpoints).drop(columns=["description"])))
        print()
        print(markdown_table(posemb_ablation_results(a.checkpoints)))
        return 0
    if a.cmd == "inspect":
        import vitviz

        print(vitviz.inspect(vitviz.load_model(a.model, checkpoint=a.checkpoint, device="cpu")))
        return 0
    return report(a)


def report(a: argparse.Namespace) -> int:
    """``vitviz report``: run ``render_report`` with the command line's settings; 1 when anything failed."""

    from vitviz.plot.style import check_formats
    from vitviz.report import render_report

    for option, folder in (("--out", a.out), ("--gallery", a.gallery)):
        if folder is not None and Path(folder).exists() and not Path(folder).is_dir():
            raise InputError(f"{option} {folder!r} is a file; pass a folder (it is made when missing)")
    try:
        check_formats(a.formats.split(","))  # refused here, not by every figure in turn
    except InputError as e:
        raise InputError(f"--formats {a.formats!r}: {e}; pass them comma-separated, e.g. --formats png,pdf") from None
    from vitviz.zoo.models import resolve_device

    try:
        resolve_device(a.device)
    except InputError as e:
        raise InputError(f"--device {a.device!r}: {e}") from None
    checkpoints, n_models = a.checkpoint or [], len(a.model or [])
    if checkpoints and len(checkpoints) != n_models:
        given = checkpoints[0] if len(checkpoints) == 1 else checkpoints
        raise InputError(f"--checkpoint {given!r} with {n_models} --model: pass one --checkpoint per --model, in the "
                         "same order ('none' for a model's own weights), e.g. --model vit_base_patch16_224 "
                         "--checkpoint ViT-B_16.npz")
    checkpoint = None if not any(checkpoints) else checkpoints[0] if n_models == 1 else checkpoints
    notebooks = None if a.notebooks is None else [] if a.notebooks == "none" else a.notebooks.split(",")
    missing = [nb for nb in notebooks or [] if not Path(nb).is_file() or Path(nb).suffix != ".ipynb"]
    if missing:
        raise DataNotFoundError(f"--notebooks {a.notebooks!r}: {missing} not found or not a notebook (.ipynb); pass "
                                "notebook files, comma-separated, 'none', or leave it out for the installed notebooks")
    try:  # a typo would fail every notebook in turn, after every figure was computed
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:  # without vitviz[notebooks] each notebook's step says what is missing
        KernelSpecManager = None
    if notebooks != [] and KernelSpecManager is not None:
        kernels = sorted(KernelSpecManager().find_kernel_specs())
        if a.kernel not in kernels:
            raise InputError(f"--kernel {a.kernel!r} is not a Jupyter kernel here; pass one of {kernels} (`jupyter "
                             "kernelspec list`), or --notebooks none to render the package figures only")
    if a.images is not None:  # refused here with exit code 2; render_report lists and names the images it uses
        from vitviz.zoo.samples import images_from

        try:
            images_from(a.images)
        except FileNotFoundError as e:
            print(f"vitviz report: --images: {e}", file=sys.stderr)
            return 2
    rep = render_report(a.out, a.model or None, tuple(a.formats.split(",")), a.device, model=(a.model or [None])[0],
                        checkpoint=checkpoint, images=a.images, notebooks=notebooks, kernel=a.kernel,
                        cell_timeout=a.cell_timeout)
    print(f"wrote {len(rep.figures)} figures and {len(rep.notebooks)} notebooks to {rep.out}/ "
          "(index.html, meta.json)")
    if a.gallery:
        from vitviz.report import write_gallery

        print(f"gallery: {len(write_gallery(rep.out, a.gallery))} figures in {a.gallery}/")
    notes = {f["note"] for f in rep.figures if f["note"]}
    if len(a.model or []) > 1 and rep.notebooks:
        notes.add(f"the notebooks take one model: they ran on the first --model, {a.model[0]!r}, only")
    for nb in rep.notebooks:
        for key, value in nb.get("not_taken", {}).items():
            option = "--model" if key == "model" else "--images"
            notes.add(f"notebook {nb['name']} takes no {key}: it ran on its own, not {option} {value!r}")
    for note in sorted(notes):
        print(f"  note: {note}")
    for f in rep.failures:
        print(f"  FAILED {f['name']}: {f['error']}", file=sys.stderr)
    return 1 if rep.failures else 0


if __name__ == "__main__":
    sys.exit(main())
