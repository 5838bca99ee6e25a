"""`commtax report`: the page for the seed job, checked as a file and in headless Chromium.

The browser is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: the
browser reads commands on fd 3 and writes replies and events on fd 4, NUL-separated JSON), so
no port, no websocket library and no timing guesses: the test waits for ``Page.loadEventFired``
and reads the console (``Runtime.consoleAPICalled``, ``Runtime.exceptionThrown``,
``Log.entryAdded``) and every request (``Network.requestWillBeSent``) as events. The page also
carries a Content-Security-Policy of ``default-src 'none'``: anything that tried to load would
be blocked *and* reported as a console error, which the test fails on.

The screenshot is kept at ``out/report-screenshot.png`` (a CI artefact path; out/ is ignored).
Without Debian's ``chromium`` the browser tests skip and say why; CI installs it (.ci/run).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from conftest import REPO, job_dict
from typer.testing import CliRunner

from commtax.cli.main import app, register_commands
from commtax.report.html import TRACE_FIELDS, trace_figures, trace_section
from commtax.schedule.analytical import estimate
from commtax.spec import load_job

register_commands()
runner = CliRunner()
SEED = REPO / "examples" / "llama2-70b-h100.yaml"
RESULTS = REPO / "examples" / "emulated" / "results"
ARTEFACTS = REPO / "out"
SCREENSHOT = ARTEFACTS / "report-screenshot.png"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BASH = shutil.which("bash") or "/bin/bash"  # moves the DevTools pipes onto fd 3 and 4 (dash takes one-digit fds only)
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)"
)


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def make_page(path: Path, *args) -> Path:
    r = run("report", *args, "-o", path)
    assert r.exit_code == 0, r.output
    return path


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """The seed page (full: --search), a job that does not fit memory (searched), and one with bench records and
    another cluster (the job's plan only)."""
    d = tmp_path_factory.mktemp("report")
    nofit = d / "nofit.yaml"
    nofit.write_text(yaml.safe_dump(job_dict(tp=8, pp=1, dp=None, zero=0)))
    return {
        "seed": make_page(d / "seed.html", SEED, "--search", "--scale", "128,256,512"),
        "nofit": make_page(d / "nofit.html", nofit, "--search", "--scale", "256,512"),
        "extras": make_page(
            d / "extras.html",
            SEED,
            "--no-search",
            "--bench",
            RESULTS / "sweep_a.json",
            "--bench-cluster",
            RESULTS / "cluster_4x1.yaml",
            "--compare",
            REPO / "examples" / "compare" / "llama2-70b-256-a100.yaml",
        ),
    }


def estimate_json(path: Path) -> dict:
    r = run("estimate", path, "--json")
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float, bool)) and v is not None:
            out[f"{prefix}{k}"] = v
    return out


class PageFacts(HTMLParser):
    """What a reader of the file (no browser) can check: numbers, figures, tables, anything external."""

    def __init__(self):
        super().__init__()
        self.numbers: dict[str, list[tuple[object, str]]] = {}
        self.svgs: list[dict] = []
        self.external: list[str] = []
        self.csp = ""
        self.figures = 0
        self.tables_per_figure: list[int] = []
        self._num: tuple[str, object] | None = None
        self._text = ""
        self._fig_depth = 0
        self._svg: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k in ("src", "href", "xlink:href", "action"):
            v = a.get(k) or ""
            if v and not v.startswith(("#", "data:")):
                self.external.append(v)
        if "url(" in (a.get("style") or "") and "url(#" not in a["style"]:
            self.external.append(a["style"])
        if tag == "meta" and a.get("http-equiv") == "Content-Security-Policy":
            self.csp = a.get("content", "")
        if tag == "span" and "data-key" in a:
            self._num = (a["data-key"], json.loads(a["data-value"]))
            self._text = ""
        if tag == "figure":
            self.figures += 1
            self._fig_depth += 1
            self.tables_per_figure.append(0)
        if tag == "table" and self._fig_depth:
            self.tables_per_figure[-1] += 1
        if tag == "svg":
            self._svg = {"id": (a.get("id") or "").removeprefix("chart-"), "shapes": 0}
            self.svgs.append(self._svg)
        if self._svg is not None and tag in ("rect", "path", "line", "circle"):
            self._svg["shapes"] += 1

    def handle_endtag(self, tag):
        if tag == "span" and self._num is not None:
            key, value = self._num
            self.numbers.setdefault(key, []).append((value, self._text))
            self._num = None
        if tag == "figure":
            self._fig_depth -= 1
        if tag == "svg":
            self._svg = None

    def handle_data(self, data):
        if self._num is not None:
            self._text += data


def facts(path: Path) -> PageFacts:
    p = PageFacts()
    p.feed(path.read_text())
    return p


# ----------------------------------------------------------------------------- the file itself
def test_every_estimate_number_is_on_the_page_exactly(pages):
    want = flatten(estimate_json(SEED))
    got = facts(pages["seed"]).numbers
    assert set(want) <= set(got), f"missing on the page: {sorted(set(want) - set(got))}"
    for key, shown in got.items():
        for value, text in shown:
            assert value == want[key], (key, value, want[key])
            assert text.strip(), key
    # what the reader sees is that value, rounded: the step time to 1e-3 s, shares to 0.1 percentage point
    step_text = got["step_time_s"][0][1]
    assert abs(float(step_text.split()[0]) - want["step_time_s"]) < 1e-3
    assert got["comm_tax"][0][1] == f"{100 * want['comm_tax']:.1f}%"
    assert got["comm_share"][0][1] == f"{100 * want['comm_share']:.1f}%"


def test_page_is_self_contained(pages):
    for name, path in pages.items():
        f = facts(path)
        assert f.external == [], (name, f.external)
        assert "default-src 'none'" in f.csp
        text = path.read_text()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", ""), name
        assert "https://" not in text, name
        assert "@import" not in text and "@font-face" not in text


def test_every_figure_has_a_drawing_and_a_table(pages):
    f = facts(pages["seed"])
    ids = [s["id"] for s in f.svgs]
    for fig in (
        "step",
        "comm-time",
        "comm-bytes",
        "memory",
        "timeline",
        "sim-vs-estimate",
        "scaling",
        "wall",
        "plans",
        "advice",
    ):
        assert fig in ids, fig
    assert all(s["shapes"] > 3 for s in f.svgs), f.svgs
    assert f.figures == len(f.svgs) and min(f.tables_per_figure) >= 1  # a table view under every chart


def test_embedded_estimate_json_is_the_command_output(pages):
    text = pages["seed"].read_text()
    start = text.index('id="estimate-json">') + len('id="estimate-json">')
    embedded = json.loads(text[start : text.index("</script>", start)])
    assert embedded == estimate_json(SEED)


def test_page_for_a_job_that_does_not_fit_memory(pages, tmp_path):
    f = facts(pages["nofit"])
    text = pages["nofit"].read_text()
    assert "Does NOT fit" in text
    assert [v for v, _ in f.numbers["fits"]] == [False]
    need = f.numbers["memory_gib_per_gpu.total"][0][0]
    assert need > load_job(job_dict(tp=8, pp=1, dp=None, zero=0)).cluster.gpu.mem_GiB
    assert "plans" in [s["id"] for s in f.svgs]  # search still shows plans that fit


def test_page_with_bench_records_and_another_cluster(pages):
    f = facts(pages["extras"])
    ids = [s["id"] for s in f.svgs]
    assert any(i.startswith("bench-") for i in ids) and "compare" in ids
    assert "plans" not in ids  # --no-search
    text = pages["extras"].read_text()
    assert "llama2-70b-256-a100" in text and "cluster_4x1.yaml" in text


def test_bench_model_curve_is_the_calibrate_prediction(tmp_path):
    """The model's busbw on the page is calibrate's predicted time for the same record (the emulated 4x1 sweep
    is within a few percent of the model: docs/measure.md)."""
    from commtax.measure.calibrate import levels_from_cluster, predicted_s
    from commtax.measure.cluster import load_cluster_file
    from commtax.report.html import BenchSet, bench_chart, bench_groups

    cluster = load_cluster_file(RESULTS / "cluster_4x1.yaml")
    records = json.loads((RESULTS / "sweep_a.json").read_text())
    bs = BenchSet("sweep_a.json", records, cluster, "cluster_4x1.yaml")
    ((key, recs),) = [(k, v) for k, v in bench_groups(bs).items() if k[0] == "all_reduce"]
    chart, _ = bench_chart(bs, key, recs)
    model = next(s for s in chart.series if s.label == "torch model")
    intra, inter = levels_from_cluster(cluster)
    r = max((r for r in recs if r["impl"] == "torch"), key=lambda r: r["message_bytes"])
    t = predicted_s(r, intra, inter)
    assert model.ys[-1] == pytest.approx(r["message_bytes"] / t * 2 * (4 - 1) / 4 / 1e9, rel=1e-12)
    measured = next(s for s in chart.series if s.label == "torch measured")
    assert measured.ys[-1] == r["busbw_GBps"]
    assert abs(model.ys[-1] / measured.ys[-1] - 1) < 0.1


def test_plots_folder_has_svg_and_png_of_every_figure(tmp_path):
    import xml.etree.ElementTree as ET

    r = run("report", SEED, "-o", tmp_path / "r.html", "--no-search", "--scale", "256", "--plots", tmp_path / "plots")
    assert r.exit_code == 0, r.output
    svgs = sorted((tmp_path / "plots").glob("*.svg"))
    pngs = sorted((tmp_path / "plots").glob("*.png"))
    assert {p.stem for p in svgs} == {p.stem for p in pngs} >= {"step", "timeline", "wall", "memory"}
    for p in svgs:
        assert ET.parse(p).getroot().tag == "{http://www.w3.org/2000/svg}svg"
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_the_page_path_imports_neither_matplotlib_nor_torch():
    code = (
        "import sys; from commtax.spec import load_job; from commtax.report.html import collect, render_page; "
        f"render_page(collect(load_job({str(SEED)!r}), 'seed', scale=[256], plan_search=False)); "
        "bad = [m for m in ('matplotlib', 'torch') if m in sys.modules]; assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def test_page_with_real_profiler_traces(tmp_path):
    """``--trace`` through ``commtax.trace``: the two sampled ranks of the shared 128-GPU A100 job."""
    from commtax.trace import analyze

    traces = [REPO.parent / "shared" / "traces" / f"a100-128gpu-sampled-rank{r}.json.gz" for r in (0, 1)]
    if not all(t.exists() for t in traces):
        pytest.skip("../shared/traces is not beside the checkout")
    out = tmp_path / "r.html"
    r = run("report", SEED, "-o", out, "--no-search", "--scale", "256", *[a for t in traces for a in ("--trace", t)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert "Measured (profiler traces) vs predicted" in page
    measured = trace_figures(analyze(traces))
    assert set(measured) == {"0", "1"}
    for figs in measured.values():  # each rank's measured comm tax is on the page as the trace module computes it
        assert f"{100 * figs['comm_tax']:.1f}%" in page


def test_trace_section_from_plain_per_rank_figures():
    b = estimate(load_job(SEED))
    per_rank = {
        "0": {
            "window_s": 18.0,
            "compute_s": 12.5,
            "comm_s": 5.0,
            "overlapped_comm_s": 0.5,
            "exposed_comm_s": 4.5,
            "idle_s": 1.0,
            "comm_tax": 0.25,
            "comm_share": 0.2857,
        },
        "1": {
            "window_s": 18.0,
            "compute_s": 12.0,
            "comm_s": 5.5,
            "overlapped_comm_s": 0.5,
            "exposed_comm_s": 5.0,
            "idle_s": 1.0,
            "comm_tax": 4.5 / 18,
            "comm_share": 0.3,
        },
    }
    html = trace_section(per_rank, b)
    assert html.count("<svg") == 1 and "rank 1" in html and "predicted" in html
    assert "25.0%" in html  # rank 0's comm tax, as given
    assert f"{b.step_time_s:.4f}" in html


def test_trace_figures_accepts_the_usual_shapes():
    figs = {f: 1.0 for f in TRACE_FIELDS}
    assert trace_figures({0: figs}) == {"0": figs}
    assert trace_figures({"per_rank": {"3": {**figs, "name": "x"}}}) == {"3": figs}
    assert trace_figures([{"rank": 5, **figs}]) == {"5": figs}


def test_bad_options_are_one_line(tmp_path):
    r = run("report", SEED, "-o", tmp_path / "r.html", "--scale", "a,b")
    assert r.exit_code == 2 and "--scale" in r.output
    r = run("report", SEED, "-o", tmp_path / "r.html", "--bench", tmp_path / "none.json")
    assert r.exit_code == 2 and "--bench" in r.output and "Traceback" not in r.output


# ----------------------------------------------------------------------------- in a real browser
class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (fd 3: commands in, fd 4: replies out)."""

    def __init__(self, profile_dir: Path):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # the browser's ends numbered above 4, so moving them onto 3 and 4 cannot clobber one another
        r, w = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser_r, from_browser_w))
        os.close(to_browser_r)
        os.close(from_browser_w)
        # the browser wants the pipes as its fd 3 and 4: bash moves them there and execs it (no preexec_fn,
        # which is unsafe while the reader threads of other browsers run)
        move = f'exec "$0" "$@" 3<&{r} 4>&{w} {r}<&- {w}>&-'
        self.log = open(profile_dir / "chromium.log", "wb")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [BASH, "-c", move, CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir / 'profile'}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            pass_fds=(r, w),
        )
        os.close(r)
        os.close(w)
        self.events: list[dict] = []
        self._replies: queue.Queue = queue.Queue()
        self._next = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        buf = b""
        while True:
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                self._replies.put(None)
                return
            buf += chunk
            while b"\0" in buf:
                msg, buf = buf.split(b"\0", 1)
                self._replies.put(json.loads(msg))

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 120):
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        return self._wait(lambda m: m.get("id") == self._next, timeout, method)

    def wait_event(self, method: str, timeout: float = 120) -> dict:
        for e in self.events:
            if e.get("method") == method:
                return e
        return self._wait(lambda m: m.get("method") == method, timeout, method)

    def _wait(self, match, timeout: float, what: str) -> dict:
        end = time.monotonic() + timeout
        while True:
            try:
                m = self._replies.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"chromium: no answer to {what} within {timeout} s") from None
            if m is None:
                raise AssertionError(f"chromium exited while waiting for {what}")
            if "method" in m:
                self.events.append(m)
            if match(m):
                if "error" in m:
                    raise AssertionError(f"chromium: {what}: {m['error']}")
                return m.get("result", m)

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
        except AssertionError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        self.log.close()


class Tab:
    def __init__(self, browser: Chromium, width: int = 1280, height: int = 900):
        self.b = browser
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.resize(width, height)

    def send(self, method, params=None):
        return self.b.send(method, params, self.session)

    def resize(self, width: int, height: int = 900):
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def open(self, url: str):
        self.b.events.clear()
        self.send("Page.navigate", {"url": url})
        self.b.wait_event("Page.loadEventFired")
        self.eval("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")

    def eval(self, expr: str):
        r = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True})
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions, and browser log errors (CSP violations, failed loads)."""
        out = []
        for e in self.b.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                out.append(f"console.{p['type']}: {p.get('args')}")
            elif m == "Runtime.exceptionThrown":
                out.append(f"exception: {p.get('exceptionDetails', {}).get('text')}")
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                out.append(f"log: {p['entry'].get('text')}")
        return out

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.b.events if e.get("method") == "Network.requestWillBeSent"]

    def screenshot(self, path: Path):
        size = self.send("Page.getLayoutMetrics")["cssContentSize"]
        shot = self.send(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
            },
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)")
    b = Chromium(tmp_path_factory.mktemp("chromium"))
    yield b
    b.close()


FIGURE_SIZES = """JSON.stringify(Array.from(document.querySelectorAll('svg.chart')).map(s => {
  const r = s.getBoundingClientRect();
  return {id: s.id, w: r.width, h: r.height, shapes: s.querySelectorAll('rect,path,line,circle').length,
          drawn: Array.from(s.querySelectorAll('rect.seg,rect.bar,path.series,.gantt-bars path'))
                      .filter(e => { const b = e.getBBox(); return b.width > 0 && b.height > 0; }).length};
}))"""
NUMBERS = """JSON.stringify(Array.from(document.querySelectorAll('span.num[data-key]')).map(e => [e.dataset.key,
  JSON.parse(e.dataset.value), e.textContent, e.getBoundingClientRect().width > 0]))"""


@needs_chromium
def test_seed_page_in_chromium(pages, browser):
    tab = Tab(browser)
    url = pages["seed"].resolve().as_uri()
    tab.open(url)
    assert tab.problems() == []
    assert tab.requests() == [url]  # the page itself, nothing else
    figs = json.loads(tab.eval(FIGURE_SIZES))
    assert len(figs) >= 10
    for f in figs:
        assert f["w"] > 200 and f["h"] > 80 and f["shapes"] > 3 and f["drawn"] > 0, f
    # the numbers the reader sees are estimate --json's, and they are visible
    want = flatten(estimate_json(SEED))
    shown = json.loads(tab.eval(NUMBERS))
    assert {k for k, *_ in shown} >= set(want)
    for key, value, text, visible in shown:
        assert value == want[key] and text.strip() and visible, key
    tab.screenshot(SCREENSHOT)
    assert SCREENSHOT.stat().st_size > 50_000


TICKS = "Array.from(document.querySelectorAll('#chart-timeline .gantt-axis text')).map(t => +t.textContent)"
ZOOM_LEVEL = "document.querySelector('[data-for=chart-timeline] .zoomlevel').textContent"


@needs_chromium
def test_timeline_zoom_and_pan(pages, browser):
    tab = Tab(browser)
    tab.open(pages["seed"].resolve().as_uri())
    before = tab.eval("document.querySelector('#chart-timeline .gantt-bars').getAttribute('transform')")
    ticks0 = tab.eval(TICKS)
    tab.eval(
        "document.querySelector('[data-for=chart-timeline] [data-zoom=in]').click(); "
        "document.querySelector('[data-for=chart-timeline] [data-zoom=in]').click()"
    )
    after = tab.eval("document.querySelector('#chart-timeline .gantt-bars').getAttribute('transform')")
    ticks = tab.eval(TICKS)
    assert after != before and tab.eval(ZOOM_LEVEL) == "×4"
    total = float(tab.eval("document.getElementById('chart-timeline').dataset.total"))
    assert max(ticks) - min(ticks) <= total / 4 + 1e-9 and len(ticks) >= 3  # ticks of the visible quarter
    tab.eval(
        "const p = document.querySelector('[data-for=chart-timeline] [data-pan]'); p.value = 1000; "
        "p.dispatchEvent(new Event('input'))"
    )
    ticks_end = tab.eval(TICKS)
    assert max(ticks_end) > 0.7 * total  # panned to the end of the step
    assert len(ticks0) >= 3 and tab.problems() == []


@needs_chromium
def test_narrow_window_and_print(pages, browser):
    tab = Tab(browser, width=380)
    tab.open(pages["seed"].resolve().as_uri())
    tab.eval("document.getElementById('step').scrollIntoView()")
    shot = tab.send("Page.captureScreenshot", {"format": "png"})  # one screen, as a phone shows it
    (ARTEFACTS / "report-screenshot-narrow.png").write_bytes(base64.b64decode(shot["data"]))
    assert tab.eval("document.documentElement.scrollWidth") <= 381  # no sideways scrolling of the page
    # charts keep a readable size and scroll sideways inside their own box; the box fits the window
    assert (
        tab.eval(
            "Math.max(...Array.from(document.querySelectorAll('.chartwrap')).map(s => s.getBoundingClientRect().right))"
        )
        <= 381
    )
    assert (
        tab.eval(
            "Math.min(...Array.from(document.querySelectorAll('svg.chart')).map(s => s.getBoundingClientRect().width))"
        )
        >= 500
    )
    tab.send("Emulation.setEmulatedMedia", {"media": "print"})
    assert tab.eval("getComputedStyle(document.querySelector('.controls')).display") == "none"
    pdf = tab.send("Page.printToPDF", {"printBackground": False})
    assert base64.b64decode(pdf["data"])[:5] == b"%PDF-"
    tab.send("Emulation.setEmulatedMedia", {"media": ""})
    assert tab.problems() == []


@needs_chromium
def test_nofit_and_extras_pages_in_chromium(pages, browser):
    for name in ("nofit", "extras"):
        tab = Tab(browser)
        url = pages[name].resolve().as_uri()
        tab.open(url)
        assert tab.problems() == [], name
        assert tab.requests() == [url], name
        figs = json.loads(tab.eval(FIGURE_SIZES))
        assert figs and all(f["w"] > 200 and f["drawn"] > 0 for f in figs), (name, figs)
    assert tab.eval("document.body.textContent.includes('Other clusters side by side')")


def test_chromium_harness_reports_console_errors_and_requests(tmp_path):
    """The browser checks can fail: a page with a console error and a blocked fetch is caught."""
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)")
    page = tmp_path / "bad.html"
    page.write_text(
        '<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; script-src 'unsafe-inline'\"></head><body>"
        "<img src=\"http://example.invalid/x.png\"><script>console.error('boom')</script></body></html>"
    )
    b = Chromium(tmp_path)
    try:
        tab = Tab(b)
        tab.open(page.resolve().as_uri())
        problems = tab.problems()
        assert any("boom" in p for p in problems)
        assert any("Content Security Policy" in p or "x.png" in p for p in problems), problems
    finally:
        b.close()
