"""Run the conformance invariants over timm's registry of ViT-like architectures; write the coverage table.

Each architecture is built with random weights (``pretrained=False``) at a small image size (4 token strides a
side). Architectures over ``MAX_REAL_PARAMS`` parameters are built on the meta device and only inspected. An
architecture ends in one of:

- ``supported``: ``tests/conformance.check_model`` passed (maps exact, row sums, output unchanged, state restored,
  analyses finite or refused where documented);
- ``refused``: ``vitviz.inspect`` raised ``UnsupportedModelError`` / ``NotAViTError`` (the reason is recorded);
- ``inspect-only``: too large to build for real; ``inspect`` on the meta device gave a consistent layout;
- ``build-failed``: timm itself could not build it at the small size nor its default size (not a vitviz result);
- ``wrong``: an invariant failed, or an error other than the clear refusal: a silently wrong answer.

Usage (also ``make test-zoo``)::

    python tests/zoo_registry.py run [--results FILE] [NAME ...]   # resumable: names already in FILE are skipped
    python tests/zoo_registry.py table [--results FILE] [--out docs/coverage.md]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PATTERNS = ("vit_*", "deit*", "eva*", "beit*", "cait_*", "flexivit_*", "samvit_*", "naflexvit_*")
PREFIXES = ("naflexvit_", "flexivit_", "samvit_", "cait_", "deit", "beit", "eva", "vit_")
MAX_REAL_PARAMS = 400e6
DEFAULT_RESULTS = ROOT / "reports" / "zoo" / "results.jsonl"


def registry_names() -> list[str]:
    import timm

    return sorted({n for p in PATTERNS for n in timm.list_models(p)})


def prefix_of(name: str) -> str:
    return next(p for p in PREFIXES if name.startswith(p))


def _reason(err: BaseException) -> str:
    """A short reason, without the model name, for grouping: the text after 'not supported:' or the first clause."""
    msg = str(err)
    msg = msg.split("not supported: ", 1)[-1]
    msg = re.sub(r"^\S+ \(timm\) ", "", msg)
    return msg.split(";")[0][:300]


def _small_input(spec) -> torch.Tensor:
    sh, sw = spec.patch_size
    if spec.dynamic_img_size:  # non-square on purpose: a swapped h/w shows up as a shape error
        return torch.randn(2, 3, 4 * sh, 6 * sw)
    return torch.randn(2, 3, *spec.img_size)


def run_one(name: str) -> dict:
    """Build, check and classify one architecture (see module docstring)."""
    import timm

    import vitviz
    from vitviz.errors import NotAViTError

    sys.path.insert(0, str(Path(__file__).parent))
    from conformance import check_model

    row: dict = {"name": name, "prefix": prefix_of(name)}
    t0 = time.perf_counter()
    try:
        with torch.device("meta"):
            meta = timm.create_model(name, pretrained=False)
        row["class"] = type(meta).__name__
        row["params"] = sum(p.numel() for p in meta.parameters())
        try:
            spec = vitviz.inspect(meta)
        except NotAViTError as e:  # UnsupportedModelError included: the clear refusal
            row.update(status="refused", reason=f"{type(e).__name__}: {_reason(e)}")
            return row
        if row["params"] > MAX_REAL_PARAMS:
            assert spec.num_heads > 0 and len(spec.attention_maps) == len(spec.attention_modules) > 0
            row.update(status="inspect-only", reason=f"{row['params'] / 1e6:.0f}M parameters: meta device")
            return row
        stride = max(spec.patch_size)
        model = None
        for kwargs in ({"img_size": 4 * stride}, {}):
            try:
                model = timm.create_model(name, pretrained=False, **kwargs).eval()
                break
            except Exception as e:  # noqa: BLE001 - timm cannot build this size; try its default
                row["build_error"] = f"{type(e).__name__}: {str(e)[:160]}"
        if model is None:
            row.update(status="build-failed", reason=row.pop("build_error"))
            return row
        spec = vitviz.inspect(model)
        summary = check_model(model, _small_input(spec))
        row.update(status="supported", maps=summary["maps"], max_abs_diff=summary["max_abs_diff"],
                   pos_embed_kind=spec.pos_embed_kind, layers=summary["layers"])
    except NotAViTError as e:
        row.update(status="refused", reason=f"{type(e).__name__}: {_reason(e)}")
    except Exception as e:  # noqa: BLE001 - anything else is a wrong answer to report
        row.update(status="wrong", reason=f"{type(e).__name__}: {str(e)[:300]}",
                   trace=traceback.format_exc(limit=3)[-800:])
    finally:
        row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def load(results: Path) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    if results.exists():
        for line in results.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                rows[r["name"]] = r
    return rows


def append(results: Path, row: dict) -> None:
    results.parent.mkdir(parents=True, exist_ok=True)
    with open(results, "a") as f:  # one line per model: a killed run resumes after the last complete line
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def table(rows: dict[str, dict]) -> str:
    """The coverage table in Markdown: per family prefix, counts per status, and the refusal reasons."""
    by_prefix: dict[str, Counter] = defaultdict(Counter)
    reasons: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in rows.values():
        by_prefix[r["prefix"]][r["status"]] += 1
        if r["status"] not in ("supported", "inspect-only"):
            reasons[(r["status"], r.get("reason", ""))].append(r["name"])
    statuses = ("supported", "inspect-only", "refused", "build-failed", "wrong")
    total = Counter(r["status"] for r in rows.values())
    real = sum(total[s] for s in ("supported", "refused", "wrong"))
    lines = [
        "# timm registry coverage",
        "",
        f"Generated by `make test-zoo` (`tests/zoo_registry.py`) with timm {_timm_version()}: every architecture "
        f"matching {', '.join(f'`{p}`' for p in PATTERNS)}, built with random weights at 4 token strides a side "
        f"(over {MAX_REAL_PARAMS / 1e6:.0f}M parameters: built on the meta device and only inspected).",
        "",
        f"**{total['supported']} of {real} real builds fully supported ({100 * total['supported'] / max(real, 1):.1f}"
        f"%)**, {total['refused']} refused with the reason, {total['wrong']} silently wrong; "
        f"{total['inspect-only']} inspected only; {total['build-failed']} not buildable by timm; {len(rows)} in all.",
        "",
        "*Supported*: every invariant of `tests/conformance.py` holds: captured maps equal a recomputation from the "
        "weights, rows sum to 1 or the documented sum, output and module state unchanged by the capture, rollout, "
        "mean attention distance and position similarity finite and shaped by the grid, or refused where the map "
        "kind has no such meaning (CaiT talking-heads, differential attention; see [zoo.md](zoo.md)). *Real builds*: "
        "supported + refused + wrong.",
        "",
        "| family prefix | " + " | ".join(statuses) + " | count |",
        "|---|" + "---:|" * (len(statuses) + 1),
    ]
    for p in PREFIXES:
        c = by_prefix.get(p)
        if c:
            lines.append(f"| `{p}*` | " + " | ".join(str(c[s]) for s in statuses) + f" | {sum(c.values())} |")
    lines.append("| **all** | " + " | ".join(str(total[s]) for s in statuses) + f" | {len(rows)} |")
    if reasons:
        lines += ["", "| status | reason | count | architectures |", "|---|---|---:|---|"]
        for (status, reason), names in sorted(reasons.items()):
            lines.append(f"| {status} | {reason.replace('|', '/')} | {len(names)} | {', '.join(sorted(names))} |")
    kinds = Counter(tuple(r.get("maps", ())) for r in rows.values() if r["status"] == "supported")
    lines += ["", "Attention map kinds of the supported architectures (`ViTSpec.attention_maps`):", "",
              "| map kinds | count |", "|---|---:|"]
    lines += [f"| {', '.join(k)} | {v} |" for k, v in sorted(kinds.items())]
    return "\n".join(lines) + "\n"


def _timm_version() -> str:
    import timm

    return timm.__version__


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("run", "table"))
    ap.add_argument("names", nargs="*")
    ap.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "coverage.md")
    args = ap.parse_args(argv)
    if args.command == "run":
        done = load(args.results)
        for name in args.names or registry_names():
            if name in done:
                continue
            row = run_one(name)
            append(args.results, row)
            print(f"{row['status']:13s} {row['seconds']:7.1f}s {name} {row.get('reason', '')}", flush=True)
        return 0
    from vitviz.core.io import atomic_write_text

    atomic_write_text(args.out, table(load(args.results)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
