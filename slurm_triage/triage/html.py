"""``triage JOBID --format html``: one self-contained page an SRE can open at 3 a.m.

Root cause first (what, where, how sure, what to do, the evidence), then one timeline per node
(power vs utilisation, temperature vs its slowdown threshold, SM clock; the hang windows, the
first failure and the drains marked), then every finding's evidence, then the sources.

Self-contained means it loads nothing: inline CSS, inline SVG drawn by matplotlib (imported
here only, Agg backend, text left as SVG text so no font is embedded or fetched), no script
at all, and a Content-Security-Policy that forbids any load should a string slip through.
Every string from the evidence (log lines, job names, drain reasons) is other people's bytes:
each is made one line (``report.safe``) and HTML-escaped; the SVG metadata (its date) is
dropped and its ids made unique per plot, so the same report renders the same bytes.
"""
from __future__ import annotations

import html
import io
import re
import time
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import TriageResult
from .model import TriageFinding
from .rules.fallback import is_fallback
from .report import _SKIP, _sources_line, readable, safe, utc
from .timeline import NodeTimeline, Series, Timeline

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
VERDICT_COLOURS = {"FAIL": "#b3261e", "WARN": "#9a6700", "UNKNOWN": "#57606a", "OK": "#1a7f37"}
POWER, UTIL, HOT, OTHER = "#1f5fa8", "#e07b00", "#d62728", "#9aa0a6"
PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
HANG_COLOUR, FIRST_COLOUR, DRAIN_COLOUR = "#d62728", "#111111", "#6f42c1"


def e(text: Any) -> str:
    """Any value as escaped one-line HTML text."""
    return html.escape(safe("" if text is None else text), quote=True)


def _where(f: TriageFinding) -> str:
    parts = [("node", f.node), ("GPU", f.gpu), ("rank", None if f.rank is None else str(f.rank))]
    return " ".join(f'<span class="where">{k} <b>{e(v)}</b></span>' for k, v in parts if v)


def _verdict(f: TriageFinding) -> str:
    v = f.verdict.value
    return f'<span class="pill" style="background:{VERDICT_COLOURS.get(v, "#57606a")}">{e(v)}</span>'


def _evidence_table(f: TriageFinding) -> str:
    rows = [f"<tr><th>{e(k)}</th><td>{e(readable(k, v))}</td></tr>" for k, v in f.evidence.items()
            if k not in _SKIP and v not in (None, [], {})]
    out = f'<table class="kv">{"".join(rows)}</table>' if rows else ""
    lines = f.evidence.get("lines") or []
    if lines:
        more = f.evidence.get("lines_total")
        out += "<pre>" + "\n".join(e(ln) for ln in lines) + "</pre>"
        if more:
            out += f'<p class="muted">{e(len(lines))} of {e(more)} matching lines shown</p>'
    return out


def _root(r: TriageResult) -> str:
    if not r.findings:
        return ('<section class="root ok"><h2>No known failure signature found</h2>'
                '<p>No rule matched the evidence below. Check the sources block: what could not be read '
                'is listed there.</p></section>')
    f = r.findings[0]
    title = "First error (no known signature)" if is_fallback(f) else "Root cause"
    pct = int(round(f.confidence * 100))
    return (f'<section class="root"><p class="kicker">{title}</p>'
            f'<h2><span class="cat">{e(f.category)}</span> {e(f.summary)}</h2>'
            f'<p class="meta">{_verdict(f)} {_where(f)} <span class="where">confidence <b>{pct} %</b>'
            f'<span class="bar"><span style="width:{pct}%"></span></span></span>'
            f' <span class="muted">id {e(f.id)}</span></p>'
            f'<div class="action"><b>What to do now:</b> {e(f.action)}</div>'
            f'<h3>Evidence</h3>{_evidence_table(f)}</section>')


def _job_table(r: TriageResult, tl: Optional[Timeline]) -> str:
    j = r.job_facts or {}
    rows: List[Tuple[str, str]] = []
    for key, label in (("state", "state"), ("exit_code", "exit code"), ("nodelist", "nodes"), ("user", "user"),
                       ("start", "start"), ("end", "end"), ("reason", "Slurm reason"), ("restarts", "restarts")):
        v = j.get(key)
        if v not in (None, "", []):
            rows.append((label, readable(key, v)))
    if j.get("start") and j.get("end"):
        rows.append(("run time", readable("run_seconds", round(float(j["end"]) - float(j["start"])))))
    if tl and tl.job_nodes:
        rows.append(("nodes in the job", str(tl.job_nodes)))
    if not rows:
        return ""
    return '<dl class="job">' + "".join(f"<div><dt>{e(k)}</dt><dd>{e(v)}</dd></div>" for k, v in rows) + "</dl>"


def _findings(r: TriageResult) -> str:
    if len(r.findings) < 2:
        return ""
    rows = []
    for i, f in enumerate(r.findings[1:], start=2):
        rel = f"follows from {e(f.caused_by)}" if f.caused_by else "independent"
        rows.append(f'<tr><td>{i}</td><td><span class="cat">{e(f.category)}</span></td><td>{_verdict(f)}</td>'
                    f'<td>{int(round(f.confidence * 100))} %</td><td>{_where(f)}</td><td>{e(f.summary)}'
                    f'<details><summary>evidence and action</summary><p><b>action:</b> {e(f.action)}</p>'
                    f'{_evidence_table(f)}</details></td><td>{rel}</td></tr>')
    return ('<section><h2>Then</h2><table class="list"><thead><tr><th>#</th><th>category</th><th>verdict</th>'
            '<th>confidence</th><th>where</th><th>summary</th><th>relation</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table></section>")


def _sources(r: TriageResult, tl: Optional[Timeline]) -> str:
    lines = _sources_line(r.sources)
    if tl is not None:
        rec = tl.record
        if rec.get("read"):
            lines.append(f"timeline: {rec.get('queries')} range/instant queries in {rec.get('seconds')} s, "
                         f"step {rec.get('step_seconds'):.0f} s, {rec.get('nodes_with_series')} node(s) with series"
                         + (f"; failed: {', '.join(rec['errors'])}" if rec.get("errors") else ""))
        else:
            lines.append(f"timeline: not read ({rec.get('error')})")
        d = rec.get("slurm_drains") or {}
        if d:
            lines.append("drains (scontrol show node): " + (", ".join(d.get("drained") or []) or "none")
                         if d.get("read") else f"drains: not read ({d.get('error')})")
    return "<section><h2>Sources</h2><ul class=\"sources\">" + "".join(f"<li>{e(s)}</li>" for s in lines) + "</ul></section>"


# --------------------------------------------------------------------------- plots

def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc)


def _is_named(s: Series, named: Sequence[str]) -> bool:
    return s.gpu in named or (s.uuid is not None and s.uuid in named)


def _lines(ax: Any, series: Sequence[Series], named: Sequence[str], colour: Optional[str], style: str = "-",
           what: str = "") -> None:
    """One line per GPU; the GPUs the findings name are drawn thick, in front, and labelled."""
    for i, s in enumerate(series):
        hot = _is_named(s, named)
        c = colour or (HOT if hot else (OTHER if named else PALETTE[i % len(PALETTE)]))
        ax.plot([_dt(t) for t, _ in s.points], [v for _, v in s.points], style, color=c,
                lw=2.4 if hot else 1.0, alpha=1.0 if hot else 0.5 if style != "-" or named else 0.8,
                zorder=3 if hot else 2,
                label=f"GPU {s.gpu}{what}" + (" (named)" if hot else ""))


def _marks(ax: Any, nt: NodeTimeline, tl: Timeline, lo: float, hi: float, legend: bool) -> None:
    width = max(tl.step, (hi - lo) / 400.0)
    for i, (a, b) in enumerate(nt.hang):
        ax.axvspan(_dt(a), _dt(max(b, a + width)), color=HANG_COLOUR, alpha=0.14, lw=0, zorder=1,
                   label="hang suspected" if legend and i == 0 else None)
    if tl.first_failure is not None and lo <= tl.first_failure <= hi:
        where = f" ({tl.first_failure_node})" if tl.first_failure_node and tl.first_failure_node != nt.node else ""
        ax.axvline(_dt(tl.first_failure), color=FIRST_COLOUR, lw=1.4, zorder=4,
                   label=f"first failure{where}" if legend else None)
    if nt.drain and nt.drain.get("time") is not None and lo <= nt.drain["time"] <= hi:
        ax.axvline(_dt(nt.drain["time"]), color=DRAIN_COLOUR, lw=1.6, ls="--", zorder=4,
                   label="drained" if legend else None)
    if hi > tl.end + 1:
        ax.axvline(_dt(tl.end), color="#555555", lw=1.0, ls=":", zorder=4, label="job end" if legend else None)


def _svg_clean(svg: str, prefix: str) -> str:
    """Inline-ready SVG: no XML prolog/doctype, no metadata (its date), ids unique to this plot."""
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    # path coordinates to 0.1 pt (matplotlib writes 6 decimals): a third fewer bytes, the same picture
    svg = re.sub(r'\bd="([^"]*)"', lambda m: 'd="' + re.sub(r"(\.\d)\d+", r"\1", m.group(1)) + '"', svg)
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}-{m.group(1)})", svg)
    svg = re.sub(r'(xlink:href|href)="#([^"]+)"', lambda m: f'{m.group(1)}="#{prefix}-{m.group(2)}"', svg)
    return svg.replace("<svg ", f'<svg role="img" aria-label="{prefix} timeline" ', 1)


def shared_limits(tl: Timeline) -> Dict[str, Tuple[float, float]]:
    """One y range per metric for every node: node2's idle power must look low next to node1's."""
    out: Dict[str, Tuple[float, float]] = {}
    for metric in ("power_watts", "temp_celsius", "sm_clock_mhz"):
        vals = [v for nt in tl.nodes for s in nt.series.get(metric, []) for _, v in s.points]
        if metric == "temp_celsius":
            vals += [nt.slowdown_celsius for nt in tl.nodes if nt.slowdown_celsius is not None and vals]
        if vals:
            lo = 0.0 if metric != "temp_celsius" else max(0.0, min(vals) - 5.0)
            out[metric] = (lo, max(vals) * 1.06 + (3.0 if metric == "temp_celsius" else 0.0) or 1.0)
    return out


def node_svg(nt: NodeTimeline, tl: Timeline, index: int, ylim: Optional[Dict[str, Tuple[float, float]]] = None) -> str:
    """The node's three panels as inline SVG (matplotlib, imported here and only here); ``ylim``
    shares each metric's range across the nodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    from matplotlib.figure import Figure

    lo = tl.start
    drained = nt.drain.get("time") if nt.drain else None
    hi = max(tl.end, drained) if drained else tl.end
    rc = {"svg.fonttype": "none", "svg.hashsalt": f"triage-{index}", "text.parse_math": False,
          "font.family": "sans-serif", "font.sans-serif": ["DejaVu Sans"], "font.size": 9, "timezone": "UTC",
          "axes.spines.top": False, "axes.grid": True, "grid.alpha": 0.3}
    with matplotlib.rc_context(rc):
        fig = Figure(figsize=(11.5, 7.0))
        # Fixed margins (not a layout engine): every node's panels line up, whatever its legend holds.
        fig.subplots_adjust(left=0.07, right=0.77, top=0.95, bottom=0.08, hspace=0.32)
        ax_p, ax_t, ax_c = fig.subplots(3, 1, sharex=True)
        power, util = nt.series.get("power_watts", []), nt.series.get("util_percent", [])
        _lines(ax_p, power, nt.highlight, POWER, what=" power")
        ax_p.set_ylabel("power (W)", color=POWER)
        ax_u = ax_p.twinx()
        _lines(ax_u, util, nt.highlight, UTIL, "--", what=" util")
        ax_u.set_ylabel("utilisation (%)", color=UTIL)
        ax_u.set_ylim(0, 105)
        ax_u.grid(False)
        ax_p.set_title("power (solid) vs utilisation (dashed): busy at idle power = hang", loc="left", fontsize=9)
        temp = nt.series.get("temp_celsius", [])
        _lines(ax_t, temp, nt.highlight, None)
        if nt.slowdown_celsius is not None:
            ax_t.axhline(nt.slowdown_celsius, color=HOT, ls="--", lw=1.2,
                         label=f"slowdown {nt.slowdown_celsius:.0f} °C")
        ax_t.set_ylabel("temperature (°C)")
        ax_t.set_title("GPU temperature vs its slowdown threshold", loc="left", fontsize=9)
        clock = nt.series.get("sm_clock_mhz", [])
        _lines(ax_c, clock, nt.highlight, None)
        ax_c.set_ylabel("SM clock (MHz)")
        ax_c.set_title("SM clock", loc="left", fontsize=9)
        for i, (ax, metric) in enumerate(((ax_p, "power_watts"), (ax_t, "temp_celsius"), (ax_c, "sm_clock_mhz"))):
            _marks(ax, nt, tl, lo, hi, legend=i == 0)
            if metric in (ylim or {}):
                ax.set_ylim(*(ylim or {})[metric])
            elif metric != "temp_celsius":
                ax.set_ylim(bottom=0)
        pad = (hi - lo) * 0.01
        ax_c.set_xlim(_dt(lo - pad), _dt(hi + pad))
        loc = mdates.AutoDateLocator(tz=timezone.utc)
        ax_c.xaxis.set_major_locator(loc)
        ax_c.xaxis.set_major_formatter(mdates.ConciseDateFormatter(loc, tz=timezone.utc))
        ax_c.set_xlabel("time (UTC)")
        # Legends: the markers and the power/util lines of the named GPUs; the GPUs beside temperature.
        h, lab = ax_p.get_legend_handles_labels()
        hu, labu = ax_u.get_legend_handles_labels()
        keep = [(a, b) for a, b in zip(h + hu, lab + labu) if not b.startswith("GPU ") or "(named)" in b]
        if power:
            keep.insert(0, (ax_p.lines[0], "power (W)"))
        if util:
            keep.insert(1 if power else 0, (ax_u.lines[0], "utilisation (%)"))
        if keep:
            ax_p.legend([a for a, _ in keep], [b for _, b in keep], loc="upper left", bbox_to_anchor=(1.09, 1.0),
                        fontsize=8, frameon=False)
        if temp:
            ax_t.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, ncol=1 + len(temp) // 9)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return _svg_clean(buf.getvalue(), f"plot{index}")


def _node_caption(nt: NodeTimeline) -> str:
    sources = sorted({s.source for lst in nt.series.values() for s in lst})
    gpus = len({s.gpu for lst in nt.series.values() for s in lst})
    bits = [f"<b>{e(nt.node)}</b>"]
    if nt.why:
        bits.append(f'<span class="named">named by: {e(nt.why)}</span>')
    if nt.series:
        bits.append(e(f"{gpus} GPU(s), series from {', '.join(sources)}"))
    if nt.slowdown_celsius is not None:
        bits.append(e(f"slowdown threshold {nt.slowdown_celsius:.0f} °C ({nt.slowdown_from})"))
    if nt.hang:
        bits.append(e("hang suspected: " + ", ".join(f"{utc(a)} – {utc(b)}" for a, b in nt.hang[:4])
                      + (f" (+{len(nt.hang) - 4} more)" if len(nt.hang) > 4 else "")))
    if nt.drain:
        when = f" at {utc(nt.drain['time'])}" if nt.drain.get("time") else ""
        bits.append(f'<span class="drain">{e(nt.drain["state"])}{e(when)}: {e(nt.drain["reason"])}</span>')
    return " · ".join(bits)


def _timeline(tl: Optional[Timeline]) -> str:
    if tl is None:
        return ('<section><h2>Timeline</h2><p class="muted">No job: a report of logs alone has no timeline.</p>'
                '</section>')
    head = ""
    if tl.record.get("read"):
        head = (f'<p class="muted">{e(utc(tl.start))} – {e(utc(tl.end))}, one point per '
                f'{e(readable("step_seconds", tl.step))}; nodes the findings name come first'
                + (e(f"; {len(tl.nodes)} of {tl.job_nodes} nodes plotted") if tl.job_nodes > len(tl.nodes) else "")
                + ".</p>")
    else:
        head = (f'<p class="warn">No metrics for the plots: {e(tl.record.get("error") or "Prometheus not read")}. '
                "The findings above come from the other sources.</p>")
    figs = []
    ylim = shared_limits(tl)
    for i, nt in enumerate(tl.nodes):
        anchor = re.sub(r"[^A-Za-z0-9_.-]", "_", nt.node)
        body = node_svg(nt, tl, i, ylim) if nt.series and tl.end > tl.start else \
            '<p class="muted">no series for this node in Prometheus over the job\'s window</p>'
        figs.append(f'<figure id="node-{e(anchor)}" class="node"><figcaption>{_node_caption(nt)}</figcaption>'
                    f"{body}</figure>")
    return "<section><h2>Timeline per node</h2>" + head + "".join(figs) + "</section>"


STYLE = """
*{box-sizing:border-box}
body{font:15px/1.45 "DejaVu Sans",system-ui,sans-serif;margin:0;background:#f4f5f7;color:#1f2328}
header,main{max-width:1280px;margin:0 auto;padding:16px 24px}
header{border-bottom:1px solid #d0d7de;background:#fff;max-width:none}
header h1{font-size:20px;margin:0 0 6px}
section{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:16px 20px;margin:16px 0}
section.root{border-left:8px solid #b3261e}
section.root.ok{border-left-color:#1a7f37}
.kicker{text-transform:uppercase;letter-spacing:.08em;font-size:12px;color:#b3261e;margin:0;font-weight:bold}
.root h2{font-size:22px;margin:4px 0 8px}
h2{font-size:18px;margin:0 0 10px} h3{font-size:15px;margin:14px 0 6px}
.cat{font:12px/1 "DejaVu Sans Mono",monospace;background:#eaeef2;border-radius:4px;padding:3px 6px;vertical-align:middle}
.pill{color:#fff;border-radius:10px;padding:2px 9px;font-size:12px;font-weight:bold}
.where{margin-left:10px;white-space:nowrap} .where b{font-family:"DejaVu Sans Mono",monospace}
.bar{display:inline-block;width:80px;height:8px;background:#eaeef2;border-radius:4px;margin-left:6px;vertical-align:middle}
.bar span{display:block;height:8px;background:#1f5fa8;border-radius:4px}
.action{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:10px 12px;margin:12px 0;font-size:16px}
table{border-collapse:collapse} th,td{text-align:left;vertical-align:top;padding:3px 10px 3px 0}
table.kv th{color:#57606a;font-weight:normal;white-space:nowrap}
table.kv td{font-family:"DejaVu Sans Mono",monospace;font-size:13px;word-break:break-word}
table.list{width:100%} table.list thead th{border-bottom:1px solid #d0d7de}
table.list tbody td{border-bottom:1px solid #eaeef2;padding:6px 10px 6px 0}
pre{background:#0d1117;color:#e6edf3;padding:10px;border-radius:6px;overflow-x:auto;font-size:12.5px;white-space:pre-wrap;word-break:break-all}
figure.node{margin:12px 0 22px} figure.node svg{width:100%;height:auto;display:block}
figcaption{font-size:14px;margin-bottom:4px}
.named{color:#b3261e} .drain{color:#6f42c1} .muted{color:#57606a} .warn{color:#9a6700;font-weight:bold}
ul.sources{font-family:"DejaVu Sans Mono",monospace;font-size:13px;padding-left:18px;word-break:break-all}
details summary{cursor:pointer;color:#1f5fa8}
dl.job{display:flex;flex-wrap:wrap;gap:4px 24px;margin:0} dl.job div{white-space:nowrap}
dl.job dt{display:inline;color:#57606a} dl.job dd{display:inline;margin:0 0 0 6px;font-family:"DejaVu Sans Mono",monospace}
"""


def render_html(result: TriageResult, timeline: Optional[Timeline], now: Optional[float] = None) -> str:
    """The whole page; ``timeline`` is None for a triage of logs alone (no job, no window)."""
    f = result.findings[0] if result.findings else None
    subject = f"job {result.job}" if result.job else "logs"
    title = f"triage {subject}: " + (f"{f.category} on {f.node}" if f and f.node else f.category if f else "nothing found")
    generated = utc(time.time() if now is None else now)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" href="data:,"><title>{e(title)}</title><style>{STYLE}</style></head><body>'
            f"<header><h1>{e(title)}</h1>{_job_table(result, timeline)}</header><main>"
            + _root(result) + _timeline(timeline) + _findings(result) + _sources(result, timeline)
            + f'<p class="muted">generated by slurm-triage at {e(generated)}; times are UTC.</p>'
            + "</main></body></html>\n")
