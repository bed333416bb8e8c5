"""`sweep report`'s index.html in a real headless browser (Chromium): the page loads with no
console errors, every embedded image decodes, every contents link lands on its section, and
nothing is fetched from elsewhere (the page opens offline and can be mailed).

Skipped where no Chromium is installed, unless SWEEP_REQUIRE_BROWSER=1 (CI installs the
Debian package and sets it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

#: first thing in <head>: collect errors and console.error calls
PROBE_HEAD = """<script>window.__errors = [];
window.addEventListener("error", e => window.__errors.push(
  String(e.message || (e.target && (e.target.src || e.target.href)) || "error")), true);
const __ce = console.error; console.error = (...a) => {
  window.__errors.push(a.map(String).join(" ")); __ce(...a); };</script>"""
#: last thing in <body>: after load, write what the page looks like into the DOM
PROBE_TAIL = """<script>window.addEventListener("load", () => {
  const imgs = [...document.images].map(i => ({alt: i.alt, ok: i.complete && i.naturalWidth > 0,
    w: i.naturalWidth, embedded: i.src.startsWith("data:image/png;base64,")}));
  const links = [...document.querySelectorAll('a[href^="#"]')].map(a => {
    const target = document.getElementById(a.getAttribute("href").slice(1));
    return {href: a.getAttribute("href"), ok: !!target,
            heading: target ? target.tagName : null}; });
  const remote = [...document.querySelectorAll("[src],link[href]")].map(
    e => e.getAttribute("src") || e.getAttribute("href")).filter(u => /^(https?:)?\\/\\//.test(u));
  const out = document.createElement("pre"); out.id = "__probe";
  out.textContent = JSON.stringify({imgs, links, remote, errors: window.__errors,
                                    title: document.title});
  document.body.appendChild(out); });</script>"""


def browser() -> str | None:
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None and os.environ.get("SWEEP_REQUIRE_BROWSER") == "1":
        pytest.fail("SWEEP_REQUIRE_BROWSER=1 but no Chromium on PATH")
    return found


def load(exe: str, page) -> tuple[dict, str]:
    """(what the probe saw, the browser's log) for ``page`` opened from disk."""
    proc = subprocess.run(
        [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=20000",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=180)
    match = re.search(r'<pre id="__probe">(.*?)</pre>', proc.stdout, re.S)
    assert match, f"the page did not finish loading: {proc.stderr[-2000:]}"
    text = match.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"') \
        .replace("&amp;", "&")
    return json.loads(text), proc.stderr


@pytest.mark.slow  # (the grid report, ~20 s, then Chromium; CI runs -m slow with Chromium installed)
def test_report_in_a_headless_browser(grid_report, tmp_path):
    exe = browser()
    if exe is None:
        pytest.skip("no Chromium here (apt-get install chromium; CI has it)")
    figures = [p.stem for p in sorted(grid_report.glob("*.png"))]
    html = (grid_report / "index.html").read_text()
    probed = tmp_path / "probed.html"  # (the page embeds its figures: it opens anywhere)
    probed.write_text(html.replace("<head>", "<head>" + PROBE_HEAD, 1)
                      .replace("</body>", PROBE_TAIL + "</body>", 1))
    seen, log = load(exe, probed)
    assert seen["errors"] == []
    console = [ln for ln in log.splitlines() if "CONSOLE" in ln and "error" in ln.lower()]
    assert console == []
    # every figure kind drawn is on the page, embedded, and decodes
    assert sorted(i["alt"] for i in seen["imgs"]) == figures
    assert len(seen["imgs"]) >= 5
    assert all(i["ok"] and i["embedded"] and i["w"] > 100 for i in seen["imgs"]), seen["imgs"]
    # the contents list: every link lands on a section heading
    assert len(seen["links"]) >= len(figures) + 2
    assert all(link["ok"] and link["heading"] == "H2" for link in seen["links"]), seen["links"]
    assert seen["remote"] == []  # nothing fetched from elsewhere: opens offline
    assert seen["title"].startswith("sweep report:")
