"""Command line: ``python -m vitviz {report,inspect,train} ...``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        from vitviz.train import main as train_main

        return train_main(argv[1:])
    p = argparse.ArgumentParser(prog="vitviz", description="Vision Transformer analysis and figures.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report", help="render every figure for the embedded reference models (offline)")
    r.add_argument("--out", default="reports", help="output folder (default: reports)")
    r.add_argument("--model", action="append", help="reference model name (repeatable; default: the defaults)")
    r.add_argument("--formats", default="png,pdf,svg", help="comma-separated figure formats")
    r.add_argument("--device", default="auto")
    i = sub.add_parser("inspect", help="print the token layout of a model")
    i.add_argument("model", help="timm name, reference model name or weights file")
    sub.add_parser("train", help="train a reference model (see python -m vitviz.train --help)")
    a = p.parse_args(argv)
    if a.cmd == "inspect":
        import vitviz

        print(vitviz.inspect(vitviz.load_model(a.model, device="cpu")))
        return 0
    from vitviz.report import DEFAULT_MODELS, render_report

    rep = render_report(a.out, tuple(a.model or DEFAULT_MODELS), tuple(a.formats.split(",")), a.device)
    print(f"wrote {len(rep.figures)} figures to {rep.out}/ (index.html, meta.json)")
    for f in rep.figures:
        if f["note"]:
            print(f"  note: {f['name']}: {f['note']}")
    for f in rep.failures:
        print(f"  FAILED {f['name']}: {f['error']}", file=sys.stderr)
    return 1 if rep.failures else 0


if __name__ == "__main__":
    sys.exit(main())
