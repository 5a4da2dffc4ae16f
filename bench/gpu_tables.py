"""The figures of one ``bench/gpu_run.sh`` run as Markdown tables, for docs/benchmarks.md and the README.

Reads the run's folder (``$OUT``: env.json, attention_*.json, attention_batch.json, dataset.json, timeline.json,
faithfulness.json, micro.json, summary.txt) and writes:

- the machine and versions (env.json);
- for each model and dtype of ``bench/attention.py``: every method's images/s, time over the plain forward's and peak
  memory above model and input, one column group per image size, under the command that reproduces it;
- the goals of every case, from ``bench/attention.py``'s own ``goal_rows`` (the one place they are computed): time
  over plain's against the goal at that size, extra memory against the kept ``(L, B, N, N)`` layer maps and against
  store-everything's;
- the batch scaling (attention_batch.json): per dtype and batch the plain forward's time and each method's time
  over it, against the time goal at that size;
- the dataset path: images/s of each run against the fastest plain forward over the same loader (goal >= 85%);
- the faithfulness loop (faithfulness.json, ``bench/faithfulness_speed.py``): its time against as many plain passes
  back to back, and that of the same loop reading each pass's output before the next;
- where a call's time goes (``bench/profile_attention.py --timeline``): per dtype and method the time until the call
  returns and until the device is done, the device's busy and kernel time, the synchronisations, the CUDA runtime
  calls that took the most host time and the longest idle stretch of the device;
- the kernels alone (``bench/headmap_kernel.py``): milliseconds per layer against SDPA, per block shape;
- each part's exit status, and what the deadline left out.

A part the run did not reach is said to be not measured, never left blank. Run from the repository root::

    python bench/gpu_tables.py bench/results/gpu_run [--out tables.md]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_attention", ROOT / "bench" / "attention.py")
attention = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(attention)

DATASET_GOAL = 0.85  # images/s of a reduction over the dataset path / a plain forward's over the same loader


def _load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def _table(header: list[str], rows: list[list[str]], numeric: set[int] | None = None) -> list[str]:
    """A Markdown table; the columns in ``numeric`` (default: all but the first) are right-aligned."""
    numeric = set(range(1, len(header))) if numeric is None else numeric
    align = ["---:" if i in numeric else "---" for i in range(len(header))]
    return ["| " + " | ".join(r) + " |" for r in [header, align, *rows]]


def _mb(v: float | None) -> str:
    return "n/a" if v is None or v != v else f"{v:.0f}"


def _machine(rows: list[dict], key: str = "gpu") -> str:
    """The GPU (and versions) the rows were measured on, as recorded in each row; every one named where the rows
    come from more than one (calls into one $OUT on different machines), so that no table passes one GPU's figures
    off as another's."""
    names = []
    for r in rows:
        v = r.get("versions") or {}
        name = str(r.get(key) or "no GPU") + (
            f", torch {v['torch']}, triton {v.get('triton')}, timm {v.get('timm')}" if v.get("torch") else "")
        names.append(name)
    names = list(dict.fromkeys(names))
    return names[0] if len(names) == 1 else "MORE THAN ONE MACHINE: " + "; ".join(names)


def attention_tables(results: list[dict]) -> list[str]:
    """One table per (model, dtype): a row per method, a column group (img/s, x plain, peak MB) per size."""
    out: list[str] = []
    cases = attention.cases(results)
    groups: dict[tuple, list[tuple]] = {}
    for key in cases:
        groups.setdefault(key[:3], []).append(key)
    for (dev, model, dtype), keys in groups.items():
        keys = sorted(keys, key=lambda k: k[3:])  # by size, then batch
        methods = list(dict.fromkeys(m for k in keys for m in cases[k]))
        first = [cases[k]["plain"] for k in keys]
        sizes = ", ".join(f"{r['size']} px: batch {r['batch']}, N = {r['tokens']}" for r in first)
        on = _machine([r for k in keys for r in cases[k].values()])
        out += ["", f"**{model}, {dtype}** ({dev}: {on}; {sizes}; median of {len(first[0]['times'])} interleaved "
                "repeats)", "", "```"]
        for k, r in zip(keys, first):
            methods_run = " ".join(cases[k])
            out.append(r.get("command") or
                       f"python bench/attention.py --device {dev} --model {model} --dtype {dtype} --sizes {r['size']} "
                       f"--batch {r['batch']} --repeats {len(r['times'])} --methods {methods_run}")
        out += ["```", ""]
        header = ["method"]
        twice = len({k[3] for k in keys}) < len(keys)  # a size at two batches: each column group names its batch
        for r in first:
            at = f"{r['size']} px, batch {r['batch']}" if twice else f"{r['size']} px"
            header += [f"{at} img/s", "x plain time", "peak MB"]
        rows = []
        for m in methods:
            row = [m]
            for k in keys:
                r, plain = cases[k].get(m), cases[k]["plain"]
                row += (["-", "-", "-"] if r is None else
                        [f"{r['images_per_s']:.0f}", f"{r['time_s'] / plain['time_s']:.2f}", _mb(r["peak_extra_mb"])])
            rows.append(row)
        out += _table(header, rows)
    return out


def goal_table(results: list[dict]) -> list[str]:
    rows = []
    for (_, model, dtype, size, _), case in attention.cases(results).items():
        for g in attention.goal_rows(case):
            time = ("no goal at this size" if g["time_met"] is None else
                    f"<= {g['time_goal']:.2f}x: {'met' if g['time_met'] else 'MISSED'}")
            kept = ("n/a" if g["kept_met"] is None else
                    f"{_mb(g['kept_mb'])} MB: {'met' if g['kept_met'] else 'MISSED'}")
            floor = "-" if g.get("x_plain_graphed") is None else f"{g['x_plain_graphed']:.2f}"
            over = g.get("extra_over_plain_graphed_mb")
            recorded = "-" if over is None else (
                f"{_mb(over)}: {'met' if g['kept_met_over_plain_graphed'] else 'MISSED'}" if g["kept_mb"] is not None
                else _mb(over))
            share = ("not measured" if g["memory_met"] is None else
                     f"{g['memory_share']:.0%} of {g['store']}'s: {'met' if g['memory_met'] else 'MISSED'}")
            rows.append([model, dtype, str(size), g["method"], f"{g['x_plain']:.2f}", floor, time, _mb(g["extra_mb"]),
                         kept, share, recorded])
    if not rows:
        return []
    return ["", "**Goals** (ratios to the plain forward of the same run; extra memory above plain's peak; a recorded "
            "call's extra memory counts its recording's pool, and its last column is its extra memory over the plain "
            "forward recorded the same way, against the kept layer maps)", "",
            *_table(["model", "dtype", "px", "method", "x plain time", "x plain_graphed time", "time goal",
                     "extra MB", "extra <= kept layer maps",
                     f"extra <= {attention.GOAL_MEMORY:.0%} of store-everything's",
                     "extra MB over plain_graphed <= kept maps"], rows, numeric={2, 4, 5, 7})]


def batch_table(results: list[dict]) -> list[str]:
    """One row per (model, dtype, size, batch) of ``bench/attention.py``: the plain forward's time and each other
    method's time over it, with the time goal at that size."""
    cases = attention.cases(results)  # a case measured twice: its later process's rows, never mixed
    methods = list(dict.fromkeys(m for case in cases.values() for m in case if m != "plain"))
    out = ["", f"**The same calls at larger batches** ({_machine(results)}; x = time over the plain forward's of the "
           "same process)", "", "```"]
    out += [case["plain"].get("command") or
            f"python bench/attention.py --device {dev} --model {model} --dtype {dtype} --sizes {size} --batch {batch} "
            f"--repeats {len(case['plain']['times'])} --methods plain {' '.join(m for m in case if m != 'plain')}"
            for (dev, model, dtype, size, batch), case in cases.items() if "plain" in case]
    out += ["```", ""]
    rows = []
    for (dev, model, dtype, size, batch), case in cases.items():
        plain = case.get("plain")
        if plain is None:
            continue
        goal = (attention.GOAL_TIME if dev == "cpu" else attention.GOAL_TIME_CUDA.get(dtype, {})).get(size)
        row = [model, dtype, str(size), str(batch), f"{plain['time_s'] * 1e3:.1f}"]
        for m in methods:
            r = case.get(m)
            x = None if r is None else r["time_s"] / plain["time_s"]
            row.append("-" if x is None else f"{x:.2f}" + ("" if goal is None else
                                                          f" ({'met' if x <= goal else 'MISSED'})"))
        rows.append(row)
    goals = ", ".join(f"{d} <= {g[448]:.2f}x" for d, g in attention.GOAL_TIME_CUDA.items() if 448 in g)
    return out + _table(["model", "dtype", "px", "batch", "plain ms", *(f"x {m}" for m in methods)], rows,
                        numeric=set(range(2, 5 + len(methods)))) + ["", f"Time goals at 448 px: {goals}."]


LOADER = ("device", "model", "source", "batch", "workers", "autocast", "processes")  # what makes two loaders the same


def dataset_table(rows: list[dict]) -> list[str]:
    """A row per run of ``bench/dataset.py``, each reduction's images/s over the fastest plain forward over the same
    loader (``LOADER``: device, model, images, batch, workers, autocast, processes); none: no share, no verdict."""
    def loader(r: dict) -> tuple:
        return tuple(r.get(k) for k in LOADER)

    plains: dict[tuple, float] = {}
    for r in rows:
        if r["reduction"] == "plain":
            plains[loader(r)] = max(plains.get(loader(r), 0.0), r["images_per_s"])
    r0 = rows[0]
    out = ["", f"**Dataset path** ({_machine(rows, 'device')}, {r0['model']}, {r0['source']}, batch {r0['batch']}, "
           f"{r0['workers']} loader workers, autocast {r0['autocast']}; goal: >= {DATASET_GOAL:.0%} of the faster "
           "plain forward over the same loader)", "", "```"]
    for r in rows:
        n = re.match(r"\d+", r["source"])
        out.append(r.get("command") or
                   f"python bench/dataset.py --model {r['model']} --synthetic {n.group(0) if n else '?'} --device cuda "
                   f"--batch {r['batch']} --workers {r['workers']} --autocast {r['autocast']} --reduction "
                   f"{r['reduction']} --kernel {r['kernel']} --warmup 4")
    out += ["```", ""]
    table = []
    for r in rows:
        plain = plains.get(loader(r))
        share = r["images_per_s"] / plain if plain else float("nan")
        verdict = "" if r["reduction"] == "plain" else (
            ": no plain forward over the same loader" if plain is None else
            ": met" if share >= DATASET_GOAL else ": MISSED")
        table.append([r["reduction"], r["kernel"], f"{r['images_per_s']:.0f}", f"{share:.0%}{verdict}",
                      f"{r['wall_s']:.1f}", _mb(r["peak_mib"])])
    return out + _table(["reduction", "kernels", "img/s", "of plain", "wall s", "peak MiB"], table, numeric={2, 4, 5})


def timeline_table(runs: list[dict]) -> list[str]:
    r0 = runs[0]
    out = ["", f"**Where a call's time goes** ({r0['device']}, {r0['size']} px, batch {r0['batch']}; ms per call: "
           "host = until the call returns, total = until the device is done, busy = the device's kernels, their "
           "intervals merged; syncs: what `torch.cuda.set_sync_debug_mode` reported in one call)", "", "```"]
    out += [f"python bench/profile_attention.py --device {r['device']} --dtype {r['dtype']} --model {r['model']} "
            f"--size {r['size']} --batch {r['batch']} --timeline --calls {r['rows'][0]['calls'] if r['rows'] else 0}"
            " --method " + " ".join(row["method"] for row in r["rows"]) for r in runs]
    out += ["```", ""]
    table = []
    for run in runs:
        for r in run["rows"]:
            runtime = sorted((r.get("runtime") or {}).items(), key=lambda kv: -kv[1]["ms"])[:3]
            gap = (r.get("gaps") or [None])[0]
            syncs = r.get("syncs")
            table.append([
                run["model"], run["dtype"], r["method"], f"{r['host_ms']:.2f}", f"{r['total_ms']:.2f}",
                f"{r['busy_ms']:.2f}" if "busy_ms" in r else "n/a",
                f"{r['kernel_ms']:.2f}" if "kernel_ms" in r else "n/a",
                "n/a" if syncs is None else str(len(syncs)) + (
                    f" ({syncs[0]['vitviz'][-1] if syncs[0]['vitviz'] else syncs[0]['at']})" if syncs else ""),
                ", ".join(f"{name} {v['calls']:.0f}x {v['ms']:.2f}" for name, v in runtime) or "n/a",
                f"{gap['ms']:.2f} after {gap['after'][:40]}" if gap else "n/a"])
    return out + _table(["model", "dtype", "method", "host", "total", "busy", "kernels", "syncs",
                         "CUDA runtime (calls, ms)", "longest idle"], table, numeric={3, 4, 5, 6})


def micro_table(rows: list[dict]) -> list[str]:
    # a configuration measured again (a part cut and run again): its later row
    rows = list({(r["shape"], r["dtype"], r["blocks"]): r for r in rows}.values())
    out = ["", f"**The kernels alone** ({_machine(rows)}; ms per layer, median of `triton.testing.do_bench`; x = over "
           "SDPA's)", "", "```"]
    for shape in dict.fromkeys(r["shape"] for r in rows):  # a command per shape: the parts sweep them differently
        mine = [r for r in rows if r["shape"] == shape]
        out.append(f"python bench/headmap_kernel.py --shapes {shape} --dtypes "
                   + " ".join(dict.fromkeys(r["dtype"] for r in mine))
                   + " --blocks " + " ".join(dict.fromkeys(r["blocks"] for r in mine)))
    out += ["```", ""]
    table = []
    for r in rows:
        if "error" in r:
            table.append([r["shape"], r["dtype"], r["blocks"], "error: " + r["error"][:80], "", "", "", "", ""])
            continue
        table.append([r["shape"], r["dtype"], r["blocks"], f"{r['sdpa_ms']:.3f}", f"{r['lse_ms']:.3f}",
                      f"{r['fuse_ms']:.3f}", f"{r['fuse+lse_ms']:.3f} ({r['fuse+lse_ms'] / r['sdpa_ms']:.2f}x)",
                      f"{r['distance_ms']:.3f} ({r['distance_ms'] / r['sdpa_ms']:.2f}x)",
                      f"{r['torch_fuse_ms']:.3f}", f"{r['max_abs']:.1e}"])
    out += _table(["shape", "dtype", "blocks", "sdpa", "lse", "fuse", "fuse+lse", "distance", "torch fuse",
                   "max abs diff"], table, numeric=set(range(3, 10)))
    return out + fastest_blocks(rows)


def fastest_blocks(rows: list[dict]) -> list[str]:
    """Per shape and dtype, the fastest block shape for each pass against vitviz's default: the sweep's answer for
    ``headmaps._blocks``."""
    out = []
    for key in dict.fromkeys((r["shape"], r["dtype"]) for r in rows if "error" not in r):
        mine = [r for r in rows if (r["shape"], r["dtype"]) == key and "error" not in r]
        default = next((r for r in mine if r["blocks"] == "default"), None)
        parts = []
        for name in ("lse", "fuse", "distance"):
            best = min(mine, key=lambda r, name=name: r[f"{name}_ms"])
            versus = f" against {default[f'{name}_ms']:.3f} by default" if default is not None else ""
            parts.append(f"{name} {best[f'{name}_ms']:.3f} ms in {best['blocks']}{versus}")
        out.append(f"- fastest, {key[0]} {key[1]}: " + "; ".join(parts))
    return [""] + out if out else []


def faithfulness_table(rows: list[dict]) -> list[str]:
    """One row per run of ``bench/faithfulness_speed.py``: the plain passes' time, the loop's and the reading loop's,
    each over the passes'."""
    out = ["", "**The faithfulness loop** (ms per call; x = over as many plain passes of the same batch, back to "
           "back; the reading loop reads each pass's output before building the next set)", "", "```"]
    out += [r.get("command") or
            f"python bench/faithfulness_speed.py --device {r['device'].split(':')[0]} --model {r['model']} --size "
            f"{r['size']} --n {r['n']} --batch {r['batch']} --steps {r['steps']} --autocast {r['autocast']}"
            for r in rows]
    out += ["```", ""]
    table = [[r["model"], str(r["size"]), r["autocast"], str(r["n"]), str(r["batch"]), str(r["passes"]),
              f"{r['passes_ms']:.1f}", f"{r['loop_ms']:.1f}", f"{r['loop_x']:.2f}", f"{r['read_each_ms']:.1f}",
              f"{r['read_each_x']:.2f}", f"{r['images_per_s']:.1f}"] for r in rows]
    return out + _table(["model", "px", "autocast", "images", "batch", "passes", "passes ms", "loop ms", "x loop",
                         "reading ms", "x reading", "img/s"], table, numeric=set(range(3, 12)))


def render(folder: Path) -> str:
    out = []
    env = _load(folder / "env.json")
    if env:
        machines = list(dict.fromkeys(json.dumps(c, sort_keys=True) for c in env.get("calls") or []))
        out += [f"### GPU: {env.get('gpu') or 'none (a rehearsal on the CPU: its figures mean nothing)'}", "",
                *([] if len(machines) < 2 else [
                    f"The calls into this folder ran on {len(machines)} machines or version sets: "
                    + "; ".join(machines) + ". Each table names its rows' own.", ""]),
                f"`bench/gpu_run.sh`: Python {env.get('python')}, torch {env.get('torch')}, timm {env.get('timm')}, "
                f"triton {env.get('triton')}, transformers {env.get('transformers')}; head-map kernels in use: "
                f"{env.get('use_kernel')}; "
                + (f"kernel smoke check FAILED: {env['smoke_error']}." if env.get("smoke_error") else
                   f"kernel smoke check, largest difference from float64: {env.get('smoke_max_abs', float('nan')):.1e}.")]
    else:
        out += ["### GPU run", "", "env.json: not written (setup did not run or failed; see summary.txt)."]
    for tag, what in (("b16", "ViT-B/16"), ("graphed", "ViT-B/16, calls recorded as CUDA graphs (vitviz.graphed)"),
                      ("l16", "ViT-L/16"), ("hf", "Hugging Face and torchvision ViT-B/16")):
        rows = _load(folder / f"attention_{tag}.json")
        out += ["", f"#### {what}"]
        if not rows:
            out += ["", f"attention_{tag}.json: not measured in this run."]
            continue
        out += attention_tables(rows) + goal_table(rows)
    batches = _load(folder / "attention_batch.json")
    out += ["", "#### ViT-B/16 at larger batches"]
    out += batch_table(batches) if batches else ["", "attention_batch.json: not measured in this run."]
    data = _load(folder / "dataset.json")
    out += ["", "#### The dataset path"]
    out += dataset_table(data) if data else ["", "dataset.json: not measured in this run."]
    faith = _load(folder / "faithfulness.json")
    out += ["", "#### The faithfulness loop"]
    out += faithfulness_table(faith) if faith else ["", "faithfulness.json: not measured in this run."]
    timeline = _load(folder / "timeline.json")
    out += ["", "#### Where a call's time goes"]
    out += timeline_table(timeline) if timeline else ["", "timeline.json: not measured in this run."]
    micro = _load(folder / "micro.json")
    out += ["", "#### The head-map kernels alone"]
    out += micro_table(micro) if micro else ["", "micro.json: not measured in this run."]
    summary = folder / "summary.txt"
    if summary.exists():
        lines = summary.read_text().splitlines()
        parts = [line for line in lines if re.match(r"^\S+: (exit \d+|SKIPPED|UNKNOWN|DONE)", line)]
        tests = [line.strip() for line in lines if re.search(r"\d+ (passed|failed|skipped)", line)]
        calls = [line for line in lines if line.startswith("gpu_run parts:")]  # one per call into this $OUT
        out += ["", "#### Parts", "", *(calls or [""]), ""] + [f"- {p}" for p in parts]
        out += ["", "`gpu` tests: " + (tests[-1] if tests else "no pytest summary in this run") + "."]
    return "\n".join(out).strip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="the run's $OUT folder")
    ap.add_argument("--out", default=None, help="write the Markdown here (default: print it)")
    args = ap.parse_args()
    folder = Path(args.folder)
    if not folder.is_dir():
        ap.error(f"folder={args.folder!r} is not a folder; pass the $OUT folder of a bench/gpu_run.sh run")
    text = render(folder)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
