"""``sweep report``: every figure that fits a sweep, and an ``index.html`` with the summary
tables, readable in a browser without Python.

The report folder holds ``index.html``, one PNG per figure kind and ``best.csv`` (the best
configuration of every case). It is written into a temporary folder next to the target and
renamed over it at the end, so a failed report never leaves a half-written folder.
"""

from __future__ import annotations

import html
import os
import shutil
import tempfile
from pathlib import Path

from .errors import SweepError
from .plot import KINDS, PlotOptions, kinds_that_fit, save, why_not
from .results import Results
from .show import config_text

__all__ = ["write_report", "CAPTIONS"]

CAPTIONS = {
    "scaling": "Throughput of the best configuration vs GPU count, one line per job and "
               "hardware variant; dotted: ideal scaling from each line's smallest GPU count.",
    "breakdown": "Where the step time of the best configuration goes: compute, exposed "
                 "memory traffic, TP / CP / DP / PP communication, pipeline bubble, "
                 "optimizer and offload, as fractions of the step.",
    "memory": "Memory per GPU of the best configuration (weights, gradients, optimizer "
              "state, activations, reserve) against the HBM capacity.",
    "heatmap": "Best throughput over two swept hardware axes at the largest GPU count.",
    "strategies": "Speed-up of each strategy's best configuration over the best 1D tensor-"
                  "parallel one.",
    "layout": "Parallel degrees (TP, TP2, CP, PP, DP) of the best configuration vs GPU count.",
}
_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:nth-child(-n+4){text-align:left}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}
.warn{background:#fff3cd;padding:.6em 1em;border:1px solid #e0c36a}
code{background:#f3f3f3;padding:0 3px}"""


#: cases listed in index.html (best.csv has them all)
SUMMARY_ROWS = 1000


def _summary_table(res: Results) -> str:
    best = {int(r["case_id"]): r for r in res.best().to_dict("records")}
    cases = res.cases.sort_values("case_id")
    rows = []
    for c in cases.head(SUMMARY_ROWS).to_dict("records"):
        r = best.get(int(c["case_id"]))
        cells = [c["case_id"], c["job"], c["hardware"], c["strategy"], c["n_gpus"]]
        if r is None:
            cells += ["no feasible configuration", "", "", "", ""]
        else:
            cells += [config_text(r), f"{r['step_time_s']:.4g}", f"{r['samples_per_s']:.5g}",
                      f"{100 * r['mfu']:.1f}", f"{r['mem_bytes'] / 2**30:.1f}"]
        if not c["complete"]:
            cells[-1] = f"{cells[-1]} (partial)"
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in cells)
                    + "</tr>")
    head = ["case", "job", "hardware", "strategy", "GPUs", "best configuration", "step [s]",
            "samples/s", "MFU [%]", "memory [GiB]"]
    more = (f"<p>The first {SUMMARY_ROWS:,} of {len(cases):,} cases; best.csv lists every "
            f"case.</p>" if len(cases) > SUMMARY_ROWS else "")
    return ("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
            + "\n".join(rows) + "</table>" + more)


def write_report(res: Results, out_dir: str | Path, kinds: list[str] | None = None) -> dict:
    """Write the report; returns {"dir", "figures": {kind: file}, "skipped": {kind: why}}."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise SweepError(f"-o: {out} exists and is not a directory")
    if not out.parent.is_dir():
        raise SweepError(f"-o: {out.parent} is not a directory")
    reasons = why_not(res)
    wanted = kinds or kinds_that_fit(res)
    skipped = {k: reasons.get(k, "not asked for") for k in KINDS if k not in wanted}
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the report is a normal folder
    try:
        figures = {}
        for kind in wanted:
            try:
                save(res, kind, tmp / f"{kind}.png", PlotOptions())
                figures[kind] = f"{kind}.png"
            except SweepError as exc:
                skipped[kind] = str(exc)
        best = res.best()
        keep = ["case_id", "job", "hardware", "strategy", "n_gpus", "dp", "tp", "tp2", "cp",
                "pp", "vpp", "mbs", "nb", "recompute", "zero", "shard_group", "sp",
                "tp_overlap", "step_time_s", "samples_per_s", "tokens_per_s", "mfu", "hfu",
                "mem_bytes"]
        best[[k for k in keep if k in best.columns]].to_csv(tmp / "best.csv", index=False)
        (tmp / "index.html").write_text(_html(res, figures, skipped))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"dir": str(out), "figures": figures, "skipped": skipped}


def _html(res: Results, figures: dict[str, str], skipped: dict[str, str]) -> str:
    a = res.attrs
    warn = (f'<p class="warn">{html.escape(res.note)}</p>' if not res.complete else "")
    facts = [("cost model", res.cost_model), ("cases", a.get("n_cases")),
             ("candidates evaluated", f"{int(a.get('candidates_evaluated', 0)):,}"),
             ("ranks (each attempt)", a.get("ranks")), ("created (UTC)", a.get("created_utc")),
             ("sweep version", a.get("sweep_version")),
             ("spec sha256", str(a.get("spec_sha256", ""))[:16] + "...")]
    fact_html = "<table>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}"
                                    f"</td></tr>" for k, v in facts) + "</table>"
    figs = "".join(f'<h2>{k}</h2><p>{html.escape(CAPTIONS[k])}</p><img src="{f}" alt="{k}">'
                   for k, f in figures.items())
    skip = "".join(f"<li><code>{k}</code>: {html.escape(v)}</li>" for k, v in skipped.items())
    spec = html.escape(str(a.get("spec", "")))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sweep report: {html.escape(res.name)}</title>
<style>{_CSS}</style></head><body>
<h1>sweep report: {html.escape(res.name)}</h1>
{warn}{fact_html}
<h2>Best configuration per case</h2>
<p>Also as <a href="best.csv">best.csv</a>. Source: <code>{html.escape(str(res.path))}</code>.</p>
{_summary_table(res)}
{figs}
{"<h2>Figures not drawn</h2><ul>" + skip + "</ul>" if skip else ""}
<h2>Resolved spec</h2><pre>{spec}</pre>
</body></html>
"""
