"""Pages in headless Chromium, read by structure, not pixels.

:func:`open_page` loads a page (or a notebook's HTML fragment inside a bare page) once in headless
Chromium (Debian's ``chromium`` package; ``.ci/run`` installs it) and returns what the page reports
about itself after it loaded: a small script (:data:`PROBE`) added before ``</body>`` counts the
token spans and their computed colours, the matrix table's rows and cells, the images (decoded or
not) and the SVG bars, and writes the counts into the DOM, which ``--dump-dom`` prints. The same run
takes a screenshot. Tests that need Chromium are marked :data:`needs_chromium` and skip, saying why,
where it is not installed.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1"]
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get "
                                                             "install chromium; .ci/run installs it)")

#: runs once the page (and its images) loaded; its report is the text of <pre id="rulegraph-probe">: one
#: for the page, or one per element with a ``data-view`` attribute (several views on one page)
PROBE = """<script>
window.addEventListener("load", () => {
  const transparent = c => c === "rgba(0, 0, 0, 0)" || c === "transparent";
  const colour = e => getComputedStyle(e).backgroundColor;
  const report = root => {
    const own = t => t.firstChild && t.firstChild.nodeType === Node.TEXT_NODE ? t.firstChild.textContent : "";
    const tokens = [...root.querySelectorAll("p.tokens")].map(p => [...p.querySelectorAll(".tok")].map(t => ({
      text: own(t), score: t.getAttribute("title"), background: colour(t), ink: getComputedStyle(t).color,
      width: t.getBoundingClientRect().width})));
    const matrices = [...root.querySelectorAll(".rulegraph-matrix table.matrix")].map(table => {
      const rows = [...table.rows];
      return {header: rows[0].cells.length - 1, rows: rows.slice(1).map(r => ({
        token: r.cells[0].textContent, cells: [...r.cells].slice(1).map(c => c.className === "none" ? null :
          {value: c.getAttribute("title"), background: colour(c)})}))};
    });
    const images = [...root.querySelectorAll("img")].map(i => ({complete: i.complete, width: i.naturalWidth,
                                                                height: i.naturalHeight,
                                                                shown: i.getBoundingClientRect().width}));
    return {tokens, matrices, images, bars: root.querySelectorAll("svg rect").length,
            tables: root.querySelectorAll("table").length,
            transparent: tokens.flat().filter(t => transparent(t.background)).length,
            text: root.textContent.length};
  };
  const views = [...document.querySelectorAll("[data-view]")];
  const body = getComputedStyle(document.body);
  const out = document.createElement("pre");
  out.id = "rulegraph-probe";
  out.style.display = "none";                         // in the DOM, not in the screenshot
  out.textContent = JSON.stringify({
    page: report(document.body), views: Object.fromEntries(views.map(v => [v.dataset.view, report(v)])),
    width: document.documentElement.scrollWidth, viewport: document.documentElement.clientWidth,
    body: {margin: body.margin, font: body.fontFamily}});
  document.body.appendChild(out);
});
</script>"""


def bare_page(views: dict[str, str]) -> str:
    """Notebook HTML outputs in an otherwise empty page, one after the other as a notebook holds
    them, each in an element ``data-view=name``."""
    body = "".join(f'<section data-view="{name}">{html}</section><hr>' for name, html in views.items())
    return f"<!doctype html><html><head><meta charset='utf-8'></head><body>{body}</body></html>"


def open_page(html: str, folder: Path, name: str, *, size: tuple[int, int] = (1200, 1400)) -> tuple[dict, Path]:
    """Load ``html`` in headless Chromium: the page's report (see :data:`PROBE`) and a screenshot
    (``folder/name.png``, ``size`` pixels)."""
    if "</body>" not in html:
        raise ValueError(f"{name}: not a page (no </body>)")
    page = folder / f"{name}.html"
    page.write_text(html.replace("</body>", PROBE + "</body>", 1), encoding="utf-8")
    shot = folder / f"{name}.png"
    with tempfile.TemporaryDirectory(prefix="rulegraph-chromium-") as profile:
        run = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                              "--dump-dom", f"--screenshot={shot}", page.as_uri()],
                             capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="rulegraph-probe"[^>]*>(.*?)</pre>', run.stdout, flags=re.S)
    assert run.returncode == 0 and found, f"{name}: Chromium gave no report (rc {run.returncode}): {run.stderr[-2000:]}"
    import html as entities
    return json.loads(entities.unescape(found.group(1))), shot


def screenshot_is_not_blank(path: Path) -> dict:
    """What a screenshot holds: the share of pixels that are not the page's white, and how many
    distinct colours (a blank or failed render has ~0 and 1)."""
    import numpy as np
    from PIL import Image
    pixels = np.asarray(Image.open(path).convert("RGB")).reshape(-1, 3)
    inked = float((np.abs(pixels.astype(int) - 255).max(1) > 24).mean())
    return {"inked": inked, "colours": len(np.unique(pixels[::7], axis=0))}
