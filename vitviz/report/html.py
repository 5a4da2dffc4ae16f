"""``reports/index.html``: links to the executed notebooks, then every package figure, then what failed."""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vitviz.report import Report

__all__ = ["index_html"]

STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto}img{max-width:100%}.note{color:#a33}"
    "table{border-collapse:collapse}td,th{padding:.2em .8em;text-align:left;border-bottom:1px solid #ddd}"
    ".failed{color:#b00;font-weight:bold}.ok{color:#070}"
)


def _e(value: Any) -> str:
    return html.escape(str(value))


def _notebook_rows(notebooks: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    if not notebooks:
        return ""
    ran = (meta.get("model"), meta.get("checkpoint"))  # the notebooks' model, with its weights file
    others = [k for k, v in meta["models"].items() if (v.get("name"), v.get("checkpoint")) != ran]
    # no model given: each notebook ran on its own default models (the reference models), said as such
    first = (f"<p class=note>The notebooks take one model: they ran on {_e(meta.get('model'))} only, not on the "
             f"package figures' other models ({_e(', '.join(others))}).</p>") if others and ran[0] is not None else ""
    rows = []
    for nb in notebooks:
        link = f'<a href="{_e(nb["html"])}">{_e(nb["name"])}</a>' if nb["html"] else _e(nb["name"])
        raw = f' (<a href="{_e(nb["executed"])}">ipynb</a>)' if nb["executed"] else ""
        if nb["ok"]:
            status = "<span class=ok>ok</span>"
        else:
            status = f"<span class=failed>failed</span>: {_e((nb['error'] or {}).get('message', ''))}"
        params = ", ".join(f"{k}={v!r}" for k, v in nb["parameters"].items() if k not in ("out_dir", "arrays_dir"))
        own = "".join(f"<br><span class=note>takes no {_e(k)}: ran on its own, not {_e(v)}</span>"
                      for k, v in nb.get("not_taken", {}).items())
        files = " ".join(f'<a href="{_e(f)}">{_e(Path(f).name)}</a>' for f in nb["files"])
        saved = f"<details><summary>{len(nb['files'])} files</summary>{files}</details>" if files else "none"
        rows.append(f"<tr><td>{link}{raw}</td><td>{status}</td><td>{nb['seconds']:.0f} s</td>"
                    f"<td>{saved}</td><td><code>{_e(params)}</code>{own}</td></tr>")
    return (f"<h2>Notebooks</h2>{first}<table><tr><th>notebook</th><th>status</th><th>time</th><th>saved</th>"
            f"<th>parameters</th></tr>{''.join(rows)}</table>")


def index_html(report: Report, meta: dict[str, Any]) -> str:
    """The report's front page: notebook links with their status, model specs, figures, failures; a report whose
    ``meta["status"]`` is not ``"complete"`` (being rendered, or stopped part-way) says so at the top."""
    sections = []
    for fig in report.figures:
        png = next((f for f in fig["files"] if f.endswith(".png")), None)
        note = f"<p class=note>{_e(fig['note'])}</p>" if fig["note"] else ""
        if fig.get("images"):
            note += f"<p>Images: {_e(fig['images'])}</p>"
        img = f'<img src="{_e(png)}" alt="{_e(fig["name"])}">' if png else ""
        links = " ".join(f'<a href="{_e(f)}">{_e(Path(f).suffix[1:])}</a>' for f in fig["files"])
        sections.append(f"<section><h2>{_e(fig['name'])}</h2>{note}{img}<p>{links}</p></section>")
    for f in report.failures:
        sections.append(f"<section><h2>{_e(f['name'])} (failed)</h2><p class=failed>{_e(f['error'])}</p>"
                        f"<pre>{_e(f.get('traceback', ''))}</pre></section>")
    specs = "".join(f"<h3>{_e(k)}</h3>" + (f"<p>Weights: <code>{_e(v['checkpoint'])}</code></p>"
                                           if v.get("checkpoint") else "") + f"<pre>{_e(v['spec'])}</pre>"
                    for k, v in meta["models"].items())
    status = meta.get("status", "complete")
    banner = "" if status == "complete" else (
        f"<p class=failed>Status: {_e(status)}. "
        + ("This report is being rendered (or its run was killed)" if status == "running" else
           "This report's run was stopped part-way")
        + ": below are only the figures and notebooks it has written so far; <code>figures/</code> may also hold "
        "files of the step that was running, not listed here. Render it again to the end for a complete report.</p>")
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>vitviz report</title><style>{STYLE}</style>"
        f"</head><body><h1>vitviz report</h1>{banner}"
        f"<p>{_e(meta['created'])}, vitviz {_e(meta['versions']['vitviz'])}, commit {_e(meta['git_commit'])}"
        f"{' with uncommitted changes' if meta.get('git_dirty') else ''}, "
        f"device {_e(meta['device'])}. Numbers behind the figures: <code>arrays/</code>; everything else: "
        f'<a href="meta.json">meta.json</a>.</p>'
        f"{_notebook_rows(report.notebooks, meta)}<h2>Package figures</h2>{specs}{''.join(sections)}</body></html>\n"
    )
