"""``sweep report``: every figure that fits a sweep, and an ``index.html`` with the summary
tables, readable in a browser without Python.

The report folder holds ``index.html``, one PNG per figure kind, ``best.csv`` (the best
configuration of every case) and ``.sweep-report``, the list of the files the report wrote.
``index.html`` is one self-contained file (the figures are embedded): it opens offline and
can be mailed. It lists its contents, then the figures, then the cases with a configuration
and, apart, those without one (no feasible configuration, or pending).

Nothing but the report's own files is ever deleted or overwritten. The report is drawn into
a temporary folder (random name) next to the target; then

* a target that does not exist is created by renaming the temporary folder (atomic);
* a target holding an earlier report (it has ``.sweep-report``), or an empty folder, gets the
  new files renamed in one by one (each atomic); files of the earlier report that the new
  one does not write are removed, every other file is left alone;
* anything else is refused: a run folder (``spec.yaml``, ``part-*.h5``, ``sweep.h5``), the
  folder of the results file, or a folder holding files sweep did not write.
"""

from __future__ import annotations

import base64
import html
import os
import shutil
import tempfile
from pathlib import Path

import yaml

from ..engine.store import list_parts, write_text_atomic
from ..errors import SweepError
from .plot import KINDS, PlotOptions, kinds_that_fit, save, why_not
from .results import Results
from .show import config_text, status_text

__all__ = ["write_report", "CAPTIONS", "MARKER"]

#: the file, in a report folder, that lists the files the report wrote
MARKER = ".sweep-report"
_MARKER_HEAD = ("# written by 'sweep report': the files below are replaced or removed by the "
                "next report into this folder; other files are left alone\n")

#: one paragraph per figure kind: what it shows, and the question it answers
CAPTIONS = {
    "scaling": "How much faster is each system, and where does scaling stop? Throughput of "
               "the best configuration vs GPU count, one line per hardware variant (colour: "
               "base system, line style: NVLink domain, labelled at its end); the thick grey line "
               "is ideal scaling from the best throughput per GPU anywhere in the panel, so "
               "the gap to it is the efficiency lost. Beyond 12 variants the rest is a grey "
               "range.",
    "breakdown": "Where does the time go as the system grows, and why did the search choose "
                 "that layout? Stacked time per iteration of the best configuration "
                 "(compute, exposed memory traffic, TP / CP / EP / DP / PP communication, "
                 "pipeline bubble, optimizer, offload) vs GPU count, with the total and the "
                 "chosen strategy and layout on each bar; every panel has the same GPU "
                 "counts. Parts under 1 % of every bar are merged into 'other'.",
    "memory": "Does it fit, and what fills the GPU? Memory per GPU of the best configuration "
              "(weights, gradients, optimizer state, activations, reserve) against the HBM "
              "capacity, in GB.",
    "heatmap": "Which hardware resource buys the most? Speed-up of the best throughput over "
               "the marked baseline cell (the lowest value of both swept axes with a "
               "feasible configuration, reading 1.0) at the largest GPU count, with contours "
               "at round speed-ups; interpolated axes are labelled with the systems they "
               "run through.",
    "strategies": "When does another parallelization strategy pay? Each strategy's best "
                  "throughput as a fraction of the best of all strategies (1 = the winner), "
                  "on one y range for every panel; a cross at 0 marks a strategy with no "
                  "feasible configuration where another one fits.",
    "layout": "How does the optimum lay the model out as it grows? The parallel degrees (TP, "
              "TP2, CP, EP, PP, DP) of the best configuration vs GPU count (lines offset a "
              "little so that equal degrees stay visible).",
    "pareto": "What is the most throughput for a given number of GPUs (or amount of a swept "
              "resource)? Every variant's best in grey, the Pareto front across hardware "
              "variants joined and labelled with the variant on it.",
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
    """The cases with a configuration (the first SUMMARY_ROWS), then the others by status:
    no feasible configuration, or pending."""
    best = {int(r["case_id"]): r for r in res.best().to_dict("records")}
    cases = res.cases.sort_values("case_id").to_dict("records")
    rows, without = [], {}
    for c in cases:
        r = best.get(int(c["case_id"]))
        if r is None:
            without.setdefault(status_text(c), []).append(int(c["case_id"]))
            continue
        if len(rows) >= SUMMARY_ROWS:
            continue
        cells = [c["case_id"], c["job"], c["hardware"], c["strategy"], c["n_gpus"],
                 config_text(r), f"{r['step_time_s']:.4g}", f"{r['samples_per_s']:.5g}",
                 f"{100 * r['mfu']:.1f}", f"{r['mem_bytes'] / 1e9:.1f}"]
        if not c["complete"]:
            cells[-1] = f"{cells[-1]} (partial)"
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in cells)
                    + "</tr>")
    head = ["case", "job", "hardware", "strategy", "GPUs", "best configuration", "step [s]",
            "samples/s", "MFU [%]", "memory [GB]"]
    with_config = len(cases) - sum(len(v) for v in without.values())
    more = (f"<p>The first {SUMMARY_ROWS:,} of {with_config:,} cases; best.csv lists every "
            f"case.</p>" if with_config > SUMMARY_ROWS else "")
    table = ("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
             + "\n".join(rows) + "</table>" + more) if rows else ""
    others = "".join(f"<p><b>{len(ids):,} cases: {html.escape(status)}</b> (case "
                     f"{html.escape(_id_ranges(ids))})</p>" for status, ids in without.items())
    return table + others


def _id_ranges(ids: list[int]) -> str:
    """Sorted case ids as ranges: 0-3, 7, 9-12."""
    out, start = [], None
    for i, v in enumerate(ids):
        if start is None:
            start = v
        if i + 1 == len(ids) or ids[i + 1] != v + 1:
            out.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)


def _tidy(value):
    """Floats in a resolved spec at 12 significant digits (2.4999999999999998e-06 -> 2.5e-06)."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: _tidy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tidy(v) for v in value]
    return value


def _spec_text(text: str) -> str:
    try:
        return yaml.safe_dump(_tidy(yaml.safe_load(text)), sort_keys=False, width=100)
    except yaml.YAMLError:
        return text


def _earlier_files(folder: Path) -> list[str]:
    """The files an earlier report in ``folder`` wrote (plain names only)."""
    try:
        lines = (folder / MARKER).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SweepError(f"-o: {folder / MARKER}: cannot read it ({exc})") from None
    return [n for n in (line.strip() for line in lines)
            if n and not n.startswith("#") and "/" not in n and n not in (".", "..", MARKER)]


def _target(out: Path, res: Results) -> list[str] | None:
    """Check that the report may write into ``out``: the files of the earlier report there
    ([] for an empty folder), or None when ``out`` does not exist yet.

    Raises:
        SweepError: ``out`` is a file, a run folder, the results file's folder, or a folder
            with files sweep report did not write.
    """
    real = out.resolve()
    if str(real) != str(out):
        out = Path(f"{out} (= {real})")  # messages name the real folder too
    if real.exists() and not real.is_dir():
        raise SweepError(f"-o: {out} exists and is not a folder")
    if not real.parent.is_dir():
        raise SweepError(f"-o: {real.parent} " + ("is not a folder" if real.parent.exists()
                                                  else "does not exist"))
    new = f"choose a new folder, e.g. -o {real / 'report'}"
    if real == Path(res.path).resolve().parent:
        raise SweepError(f"-o: {out} holds the results file {Path(res.path).name}; a report "
                         f"never writes into a run folder; {new}")
    if not real.exists():
        return None
    run_files = [n for n in ("spec.yaml", "sweep.h5") if (real / n).exists()]
    run_files += [p.name for p in list_parts(real)][:1]
    if run_files:
        raise SweepError(f"-o: {out} is a sweep run folder (it holds {', '.join(run_files)}); "
                         f"a report never writes into a run folder; {new}")
    entries = os.listdir(real)
    if MARKER in entries:
        return _earlier_files(real)
    if entries:
        raise SweepError(f"-o: {out} is not empty and was not written by sweep report (no "
                         f"{MARKER} in it); nothing in it is touched: choose a new or empty "
                         f"folder")
    return []


def _marker(names: list[str]) -> str:
    return _MARKER_HEAD + "".join(f"{n}\n" for n in sorted(names))


def _move_in(tmp: Path, out: Path, names: list[str], earlier: list[str]) -> None:
    """Rename the new files from ``tmp`` into the existing folder ``out`` (each atomic) and
    remove the earlier report's files the new one does not have; nothing else is touched."""
    # first list both sets, so an interrupted swap leaves no file of ours unlisted
    write_text_atomic(out / MARKER, _marker(sorted(set(names) | set(earlier))))
    for name in sorted(names, key=lambda n: n == "index.html"):  # the page last
        os.replace(tmp / name, out / name)
    for name in sorted(set(earlier) - set(names)):
        path = out / name
        if path.is_symlink() or path.is_file():
            path.unlink()
    write_text_atomic(out / MARKER, _marker(names))


#: a report's temporary folder left behind (its process killed) is removed by the next
#: report of the same folder once its process is gone and it is this old (seconds)
STALE_AFTER_S = 3600.0


def _remove_stale(real: Path) -> None:
    """Remove the temporary folders ``.NAME.report-PID-*`` that earlier reports of ``real``
    left beside it when killed (SIGKILL: no clean-up ran): those whose process no longer
    runs on this host and that are older than STALE_AFTER_S (a report another host is
    writing on a shared file system keeps its folder)."""
    import time

    try:
        leftovers = list(real.parent.glob(f".{real.name}.report-*-*"))
    except OSError:
        return
    for path in leftovers:
        try:
            pid = int(path.name[len(f".{real.name}.report-"):].split("-", 1)[0])
            if time.time() - path.stat().st_mtime < STALE_AFTER_S or _alive(pid):
                continue
        except (ValueError, OSError):
            continue
        shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (another user's: it runs)
        return True
    return True


def write_report(res: Results, out_dir: str | Path, kinds: list[str] | None = None) -> dict:
    """Write the report; returns {"dir", "figures": {kind: file}, "skipped": {kind: why}}.

    Raises:
        SweepError: ``out_dir`` may not be written (see the module doc) or cannot be.
    """
    out = Path(out_dir)
    earlier = _target(out, res)
    real = out.resolve()
    reasons = why_not(res)
    for kind in kinds or ():  # a kind asked for by name says nothing here: as sweep plot
        if kind in reasons:
            raise SweepError(f"--kind {kind}: {reasons[kind]}; nothing written")
    wanted = kinds or kinds_that_fit(res)
    skipped = {k: reasons.get(k, "not asked for") for k in KINDS if k not in wanted}
    _remove_stale(real)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{real.name}.report-{os.getpid()}-",
                                    dir=real.parent))
    except OSError as exc:
        raise SweepError(f"-o: cannot write into {real.parent}: {exc.strerror}") from None
    moved = False
    try:
        figures = {}
        for kind in wanted:
            try:
                save(res, kind, tmp / f"{kind}.png", PlotOptions())
                figures[kind] = f"{kind}.png"
            except SweepError as exc:
                skipped[kind] = str(exc)
        best = res.best()
        # the whole configuration (every CANDIDATE field: MoE's ep, etp and a2a_overlap,
        # the NVLink placement, recompute layers, offload, CP's exchange), then its metrics
        from ..model.schema import CANDIDATE_DTYPE

        keep = ["case_id", "job", "hardware", "strategy", "n_gpus",
                *(n for n in CANDIDATE_DTYPE.names if n != "index"),
                "step_time_s", "samples_per_s", "tokens_per_s", "mfu", "hfu", "mem_bytes"]
        best[[k for k in keep if k in best.columns]].to_csv(tmp / "best.csv", index=False)
        (tmp / "index.html").write_text(_html(res, figures, skipped, tmp))
        names = sorted(os.listdir(tmp))
        if earlier is None:
            (tmp / MARKER).write_text(_marker(names))
            tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it private; a report is a normal folder
            try:
                os.rename(tmp, real)  # fails if a non-empty folder appeared there meanwhile
                moved = True
            except OSError:
                if not real.is_dir():
                    raise
                _move_in(tmp, real, names, _target(out, res) or [])
        else:
            _move_in(tmp, real, names, earlier)
    except OSError as exc:
        raise SweepError(f"-o: {out}: cannot write the report: {exc.strerror or exc}") from None
    finally:
        if not moved:
            shutil.rmtree(tmp, ignore_errors=True)  # ours: made by mkdtemp, random name
    return {"dir": str(out), "figures": figures, "skipped": skipped}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _html(res: Results, figures: dict[str, str], skipped: dict[str, str],
          folder: Path) -> str:
    """index.html: contents, the figures (embedded, so the page is one self-contained file),
    the cases, the figures not drawn, the resolved spec."""
    a = res.attrs
    warn = (f'<p class="warn">{html.escape(res.note)}</p>' if not res.complete else "")
    facts = [("cost model", res.cost_model), ("cases", a.get("n_cases")),
             ("candidates evaluated", f"{int(a.get('candidates_evaluated', 0)):,}"),
             ("workers per attempt (ranks; shards x ranks for an array)", a.get("ranks")),
             ("created (UTC)", a.get("created_utc")),
             ("sweep version", a.get("sweep_version")),
             ("spec sha256", str(a.get("spec_sha256", ""))[:16] + "...")]
    fact_html = "<table>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}"
                                    f"</td></tr>" for k, v in facts) + "</table>"
    contents = [(f"fig-{k}", f"figure: {k}") for k in figures]
    contents += [("cases", "best configuration per case")]
    contents += [("not-drawn", "figures not drawn")] if skipped else []
    contents += [("spec", "resolved spec")]
    nav = "<ul>" + "".join(f'<li><a href="#{i}">{html.escape(t)}</a></li>'
                           for i, t in contents) + "</ul>"
    figs = "".join(
        f'<h2 id="fig-{k}">{k}</h2><p>{html.escape(CAPTIONS[k])}</p>'
        f'<img src="data:image/png;base64,{base64.b64encode((folder / f).read_bytes()).decode()}"'
        f' alt="{k}" data-file="{f}">' for k, f in figures.items())
    skip = "".join(f"<li><code>{k}</code>: {html.escape(v)}</li>" for k, v in skipped.items())
    spec = html.escape(_spec_text(str(a.get("spec", ""))))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sweep report: {html.escape(res.name)}</title>
<style>{_CSS}</style></head><body>
<h1>sweep report: {html.escape(res.name)}</h1>
{warn}{fact_html}
<h2>Contents</h2>{nav}
{figs}
<h2 id="cases">Best configuration per case</h2>
<p>Also as <a href="best.csv">best.csv</a>. Source: <code>{html.escape(str(res.path))}</code>.
Memory in GB (10<sup>9</sup> bytes).</p>
{_summary_table(res)}
{'<h2 id="not-drawn">Figures not drawn</h2><ul>' + skip + "</ul>" if skip else ""}
<h2 id="spec">Resolved spec</h2><pre>{spec}</pre>
</body></html>
"""
