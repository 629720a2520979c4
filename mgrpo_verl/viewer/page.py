"""The page: per step a few main rollouts as trees, per-agent curves as inline SVG, one file with its CSS and script
inline. Every dumped text goes through :func:`esc` (model output is hostile); the script only opens, closes and
hides what the HTML already holds, and reads no dumped data."""

from __future__ import annotations

import html
import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Optional

from mgrpo_verl.viewer.load import Dump

#: Main rollouts shown per step by default, spread from the best score to the worst.
ROLLOUTS_PER_STEP = 3

#: Characters of one text shown (the rest is cut, with a note): a page stays a page whatever a model wrote.
MAX_TEXT = 20_000

#: Deepest tree shown (main -> sub -> ...); a row below is only named.
MAX_DEPTH = 6

#: Agent colours, in the order of :meth:`Dump.agents`.
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")

#: The traj_id of a sub-agent's call: ``{uid}/{session}/{agent}/{index}`` (mgrpo_verl/rowmeta.py).
CALL_INDEX = re.compile(r"/(\d+)$")


def esc(value: Any) -> str:
    """``value`` as HTML text (quotes included: safe in attributes too)."""
    return html.escape("" if value is None else str(value), quote=True)


def _cut(text: Any) -> str:
    text = "" if text is None else str(text)
    return (text if len(text) <= MAX_TEXT
            else text[:MAX_TEXT] + f"\n... ({len(text) - MAX_TEXT} more characters not shown)")


def fmt(value: Any, signed: bool = False) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "–"
    value = 0.0 if abs(value) < 5e-4 else value  # no "-0.000"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def fate_label(fate: Any) -> str:
    """``"kept"``, ``"duplicated x2"``, ``"dropped, borrowed x1"`` (rollout_log.fate_label, read back)."""
    if not isinstance(fate, dict):
        return ""
    label = str(fate.get("kind", ""))
    if fate.get("copies"):
        label += f" x{fate['copies']}"
    if fate.get("borrowed"):
        label += f", borrowed x{fate['borrowed']}"
    return label


def _mean(values: Iterable[Any]) -> Optional[float]:
    xs = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return sum(xs) / len(xs) if xs else None


# --------------------------------------------------------------------------------------------- trees


def _call_index(row: dict) -> int:
    match = CALL_INDEX.search(row["traj_id"])
    return int(match.group(1)) if match else 0


def spread(rows: list[dict], n: int) -> list[dict]:
    """``n`` of ``rows`` from the best score to the worst, evenly spaced (all of them when there are no more)."""
    ranked = sorted(rows, key=lambda r: (-(r.get("score") if isinstance(r.get("score"), (int, float)) else -math.inf),
                                         r["key"]))
    if len(ranked) <= n:
        return ranked
    if n == 1:
        return ranked[:1]
    picks = sorted({round(i * (len(ranked) - 1) / (n - 1)) for i in range(n)})
    return [ranked[i] for i in picks]


class Tree:
    """The rows of one step, by trajectory and by parent."""

    def __init__(self, rows: list[dict], colours: dict[str, str]):
        self.colours = colours
        self.children: dict[str, list[dict]] = defaultdict(list)
        traj = {r["traj_id"] for r in rows}
        self.mains = [r for r in rows if not r["parent_traj_id"]]
        self.orphans = [r for r in rows if r["parent_traj_id"] and r["parent_traj_id"] not in traj]
        for row in rows:
            if row["parent_traj_id"]:
                self.children[row["parent_traj_id"]].append(row)
        for kids in self.children.values():
            kids.sort(key=lambda r: (r["agent"], _call_index(r), r["key"]))

    def node(self, row: dict, depth: int = 0, seen: Optional[set] = None) -> str:
        """One row's ``<details>``: its summary line, fields, prompt, turns; its children nested under the turn
        whose ``ask_<agent>`` call made them (the rest after its first model turn)."""
        seen = set() if seen is None else seen
        if row["traj_id"] in seen or depth > MAX_DEPTH:
            return f'<p class="cut">{esc(row["traj_id"])} (not shown: depth or cycle)</p>'
        seen = seen | {row["traj_id"]}
        queues: dict[str, list[dict]] = defaultdict(list)
        for kid in self.children.get(row["traj_id"], []):
            queues[kid["agent"]].append(kid)
        turns = row.get("turns") if isinstance(row.get("turns"), list) else []
        parts, placed = [], False
        for number, turn in enumerate(turns, 1):
            if not isinstance(turn, dict):
                continue
            parts.append(self._turn(turn, number, queues, depth, seen))
            if not placed and turn.get("role") == "model":
                rest = [kid for kids in queues.values() for kid in kids]
                if rest and any(t.get("role") != "model" for t in turns[number:] if isinstance(t, dict)):
                    parts.append(self._calls(rest, depth, seen, "calls made after this turn"))
                    queues.clear()
                placed = True
        rest = [kid for kids in queues.values() for kid in kids]
        if rest:
            parts.append(self._calls(rest, depth, seen, "calls"))
        colour = self.colours.get(row["agent"], PALETTE[-1])
        is_main = not row["parent_traj_id"]
        return (
            f'<details class="node{" main" if is_main else " sub"}" data-agent="{esc(row["agent"])}" '
            f'data-traj="{esc(row["traj_id"])}" open style="--agent:{colour}">'
            f"<summary>{self._summary(row)}</summary><div class=\"body\">{self._fields(row)}"
            f'<details class="prompt"><summary>prompt · {esc(row.get("prompt_tokens", "?"))} tokens</summary>'
            f'<pre>{esc(_cut(row.get("prompt")))}</pre></details>'
            f'<ol class="turns">{"".join(parts)}</ol></div></details>'
        )

    def _summary(self, row: dict) -> str:
        fate = row.get("fate")
        bits = [f'<span class="agent">{esc(row["agent"])}</span>', f'<code class="traj">{esc(row["traj_id"])}</code>',
                f'<span class="num">score {fmt(row.get("score"))}</span>']
        if row.get("advantage") is not None or row.get("split") == "train":
            bits.append(f'<span class="num">adv {fmt(row.get("advantage"), signed=True)}</span>')
        label = fate_label(fate)
        if label:
            kind = esc(fate.get("kind", "")) if isinstance(fate, dict) else ""
            bits.append(f'<span class="fate fate-{kind}">{esc(label)}</span>')
        if isinstance(fate, dict):
            for key, what in (("borrowed_in", "borrowed in"), ("padding", "padding")):
                if isinstance(fate.get(key), dict) and fate[key]:
                    bits.append(f'<span class="slots">{what}: ' + ", ".join(
                        f"{esc(a)} ×{esc(n)}" for a, n in fate[key].items()) + "</span>")
        if row.get("trainable") is False:
            bits.append('<span class="frozen">frozen</span>')
        if row.get("error"):
            bits.append('<span class="error">not a multi-agent row</span>')
        return " ".join(bits)

    @staticmethod
    def _fields(row: dict) -> str:
        shown = [("key", row.get("key")), ("uid", row.get("uid")), ("parent", row.get("parent_traj_id") or "–")]
        if not row.get("parent_traj_id"):
            shown.append(("calls", f'{row.get("calls", "?")} ({row.get("failed_calls", 0)} failed)'))
        if "ground_truth" in row:
            shown.append(("ground truth", json.dumps(row["ground_truth"], ensure_ascii=False)))
        info = row.get("reward_extra_info")
        if isinstance(info, dict) and info:
            shown.append(("reward info", ", ".join(f"{k}={v}" for k, v in info.items() if k != "answer")))
        if row.get("error"):
            shown.append(("error", row["error"]))
        return '<dl class="fields">' + "".join(f"<dt>{esc(k)}</dt><dd>{esc(_cut(v))}</dd>" for k, v in shown) + "</dl>"

    def _turn(self, turn: dict, number: int, queues: dict, depth: int, seen: set) -> str:
        role = "model" if turn.get("role") == "model" else "env"
        calls = turn.get("tool_calls") if isinstance(turn.get("tool_calls"), list) else []
        items = []
        for call in calls:
            if not isinstance(call, dict):
                continue
            name = str(call.get("name") or "")
            if call.get("error") or not name:
                items.append(f'<li class="call bad"><span class="error">unreadable call</span> {esc(call.get("error"))}'
                             f'<pre>{esc(_cut(call.get("raw")))}</pre></li>')
                continue
            args = call.get("arguments")
            args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, indent=1)
            nested = ""
            if name.startswith("ask_") and queues.get(name[4:]):
                nested = self.node(queues[name[4:]].pop(0), depth + 1, seen)
            items.append(f'<li class="call"><code class="tool">{esc(name)}</code>'
                         f'<pre class="args">{esc(_cut(args_text))}</pre>'
                         f"{nested}</li>")
        calls_html = f'<ul class="calls">{"".join(items)}</ul>' if items else ""
        return (f'<li class="turn {role}"><div class="turn-head">{role} · turn {number} · '
                f'{esc(turn.get("tokens", "?"))} tokens'
                f'{f" · {len(items)} tool calls" if items else ""}</div>'
                f'<pre>{esc(_cut(turn.get("text")))}</pre>{calls_html}</li>')

    def _calls(self, kids: list[dict], depth: int, seen: set, title: str) -> str:
        return (f'<li class="delegations"><div class="turn-head">{esc(title)}: {len(kids)}</div>'
                + "".join(self.node(kid, depth + 1, seen) for kid in kids) + "</li>")


# -------------------------------------------------------------------------------------------- curves


def line_chart(title: str, series: dict[str, list[tuple[int, float]]], colours: dict[str, str]) -> str:
    """An inline SVG line chart, one line per agent, a tooltip (``<title>``) per point."""
    series = {a: pts for a, pts in series.items() if pts}
    head = f'<figure class="chart"><figcaption>{esc(title)}</figcaption>'
    if not series:
        return head + '<p class="empty">no data</p></figure>'
    w, h, left, right, top, bottom = 440, 220, 56, 14, 12, 32
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    x0, x1 = min(xs), max(xs)
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    y0, y1 = min(ys), max(ys)
    if y0 == y1:
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (w - left - right)

    def sy(y: float) -> float:
        return top + (y1 - y) / (y1 - y0) * (h - top - bottom)

    out = [f'<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{esc(title)}">']
    for y in (y0, (y0 + y1) / 2, y1):
        out.append(f'<line class="grid" x1="{left}" x2="{w - right}" y1="{sy(y):.1f}" y2="{sy(y):.1f}"/>'
                   f'<text class="tick" x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{esc(f"{y:.3g}")}</text>')
    steps = sorted(set(xs))
    if len(steps) > 8:
        steps = sorted({steps[round(i * (len(steps) - 1) / 7)] for i in range(8)})
    for x in steps:
        out.append(f'<text class="tick" x="{sx(x):.1f}" y="{h - bottom + 16}" text-anchor="middle">{esc(x)}</text>')
    out.append(f'<text class="tick" x="{(left + w - right) / 2:.1f}" y="{h - 4}" text-anchor="middle">step</text>')
    for agent, pts in series.items():
        colour = colours.get(agent, PALETTE[-1])
        pts = sorted(pts)
        if len(pts) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
            out.append(f'<polyline class="line" points="{path}" stroke="{colour}"/>')
        for x, y in pts:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}">'
                       f"<title>{esc(agent)} · step {esc(x)}: {esc(f'{y:.4g}')}</title></circle>")
    out.append("</svg>")
    legend = "".join(f'<span class="key"><i style="background:{colours.get(a, PALETTE[-1])}"></i>{esc(a)}</span>'
                     for a in series)
    return head + "".join(out) + f'<div class="legend">{legend}</div></figure>'


def curves(dump: Dump, colours: dict[str, str]) -> str:
    """Per agent and training step: mean score, mean |advantage| (group-relative advantages average to about 0 by
    construction: their size is the signal), rows; per validation step: mean score."""
    charts = []
    specs = (("train", "score", "mean score per training step"),
             ("train", "|advantage|", "mean |advantage| per training step"),
             ("train", None, "rows per training step"), ("val", "score", "mean score per validation"))
    for split, key, title in specs:
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for step, rows in dump.by_step(split).items():
            for agent in dump.agents():
                mine = [r for r in rows if r["agent"] == agent]
                if not mine:
                    continue
                if key is None:
                    value: Optional[float] = float(len(mine))
                elif key == "|advantage|":
                    value = _mean(abs(r["advantage"]) for r in mine if isinstance(r.get("advantage"), (int, float)))
                else:
                    value = _mean(r.get(key) for r in mine)
                if value is not None:
                    series[agent].append((step, value))
        charts.append(line_chart(title, {a: series[a] for a in dump.agents() if a in series}, colours))
    return '<section id="curves"><h2>Per-agent curves</h2><div class="charts">' + "".join(charts) + "</div></section>"


# ---------------------------------------------------------------------------------------------- steps


def step_section(split: str, step: int, rows: list[dict], dump: Dump, colours: dict[str, str], n: int,
                 open_: bool) -> str:
    tree = Tree(rows, colours)
    per_agent = []
    for agent in dump.agents():
        mine = [r for r in rows if r["agent"] == agent]
        if mine:
            stats = f"score {fmt(_mean(r.get('score') for r in mine))}"
            if split == "train":
                stats += f", adv {fmt(_mean(r.get('advantage') for r in mine), signed=True)}"
            per_agent.append(f'<span class="agent-stat" style="--agent:{colours.get(agent, PALETTE[-1])}">'
                             f"{esc(agent)}: {len(mine)} rows ({stats})</span>")
    shown = spread(tree.mains, n)
    note = f"{len(shown)} of {len(tree.mains)} main rollouts, from the best score to the worst"
    if tree.orphans:
        note += f"; {len(tree.orphans)} rows whose parent is not in this dump"
    trees = "".join(f'<div class="rollout" data-rank="{i}">{tree.node(row)}</div>' for i, row in enumerate(shown))
    return (f'<details class="step" id="{split}-{step}" data-split="{split}" data-step="{step}"'
            f'{" open" if open_ else ""}>'
            f'<summary><b>{"training" if split == "train" else "validation"} step {step}</b> · {len(rows)} rows · '
            f'{" · ".join(per_agent)}</summary><p class="note">{esc(note)}</p>{trees}</details>')


def render_page(dump: Dump, title: str = "rollouts", rollouts_per_step: int = ROLLOUTS_PER_STEP) -> str:
    """The whole page as one string."""
    agents = dump.agents()
    colours = {a: PALETTE[i % len(PALETTE)] for i, a in enumerate(agents)}
    sections = []
    for split, heading in (("train", "Training steps"), ("val", "Validation")):
        by_step = dump.by_step(split)
        if not by_step:
            continue
        last = max(by_step)
        sections.append(f'<section class="split" id="split-{split}"><h2>{heading}</h2>' + "".join(
            step_section(split, step, rows, dump, colours, rollouts_per_step, step == last)
            for step, rows in by_step.items())
            + "</section>")
    filters = "".join(f'<label class="filter" style="--agent:{colours[a]}"><input type="checkbox" class="agent-filter" '
                      f'data-agent="{esc(a)}" checked> {esc(a)}</label>' for a in agents)
    skipped = ""
    if dump.skipped:
        skipped = (f'<details class="skipped"><summary>{len(dump.skipped)} lines skipped</summary><pre>'
                   + esc("\n".join(dump.skipped[:200])) + "</pre></details>")
    meta = (f"{len(dump.rows)} rows · {len(dump.steps('train'))} training steps · "
            f"{len(dump.steps('val'))} validations · "
            f"{len(dump.files)} files · agents: {', '.join(agents)}")
    return (
        '<!DOCTYPE html>\n<html lang="en" data-js-errors="0"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><script>{ERROR_HOOK}</script><style>{CSS}</style></head><body>"
        f'<header><h1>{esc(title)}</h1><p class="meta">{esc(meta)}</p>{skipped}'
        '<div class="controls"><button type="button" id="expand">expand all</button>'
        '<button type="button" id="collapse">collapse all</button>'
        f'<span class="filters">agents: {filters}</span><span id="status"></span></div>'
        '<pre id="js-errors" hidden></pre></header>'
        f"<main>{curves(dump, colours)}{''.join(sections)}</main><script>{SCRIPT}</script></body></html>\n"
    )


def write_page(dump: Dump, out: Path, title: str = "rollouts", rollouts_per_step: int = ROLLOUTS_PER_STEP) -> Path:
    """:func:`render_page` written to ``out`` (UTF-8); returns ``out``."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_page(dump, title, rollouts_per_step), encoding="utf-8")
    return out


# ------------------------------------------------------------------------------------- CSS and script

#: Runs first: every script error is counted on ``<html data-js-errors>`` and listed in ``#js-errors``.
ERROR_HOOK = """
window.__pageErrors = [];
window.onerror = function (message, source, line) {
  window.__pageErrors.push(String(message) + " (" + source + ":" + line + ")");
  document.documentElement.setAttribute("data-js-errors", String(window.__pageErrors.length));
  var box = document.getElementById("js-errors");
  if (box) { box.hidden = false; box.textContent = window.__pageErrors.join("\\n"); }
  return false;
};
"""

#: Expand / collapse all, the agent filter, the status line; marks ``<body data-ready="1">`` when done.
SCRIPT = """
(function () {
  var all = function (sel) { return Array.prototype.slice.call(document.querySelectorAll(sel)); };
  document.getElementById("expand").addEventListener("click", function () {
    all("details").forEach(function (d) { d.open = true; });
  });
  document.getElementById("collapse").addEventListener("click", function () {
    all("details.step, details.prompt").forEach(function (d) { d.open = false; });
  });
  var boxes = all("input.agent-filter");
  function apply() {
    var hidden = {};
    boxes.forEach(function (b) { if (!b.checked) { hidden[b.getAttribute("data-agent")] = true; } });
    all("details.node").forEach(function (n) {
      n.classList.toggle("hidden", hidden[n.getAttribute("data-agent")] === true);
    });
  }
  boxes.forEach(function (b) { b.addEventListener("change", apply); });
  apply();
  var status = document.getElementById("status");
  status.textContent = all("div.rollout").length + " rollout trees, " + all("details.node").length + " rows shown";
  document.body.setAttribute("data-ready", "1");
})();
"""

CSS = """
:root { --fg: #1b1f24; --muted: #5b6570; --line: #d5dae0; --bg: #ffffff; --soft: #f5f7f9; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
header { padding: 12px 20px; border-bottom: 1px solid var(--line); position: sticky; top: 0; background: var(--bg); z-index: 2; }
h1 { font-size: 18px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 18px 0 8px; }
main { padding: 0 20px 40px; }
.meta, .note { color: var(--muted); margin: 2px 0; }
.controls { display: flex; gap: 10px; align-items: center; flex-wrap: wrap; margin-top: 6px; }
.controls button { font: inherit; padding: 2px 10px; }
.filter { border-left: 4px solid var(--agent); padding-left: 4px; margin-right: 6px; }
#status { color: var(--muted); }
#js-errors { color: #b00020; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
.chart { margin: 0; border: 1px solid var(--line); border-radius: 6px; padding: 6px 8px; background: var(--soft); }
.chart figcaption { font-weight: 600; margin-bottom: 2px; }
.chart .grid { stroke: var(--line); } .chart .tick { font-size: 11px; fill: var(--muted); }
.chart .line { fill: none; stroke-width: 2; }
.legend .key { margin-right: 12px; } .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; }
details.step { border: 1px solid var(--line); border-radius: 6px; margin: 8px 0; padding: 4px 10px; }
details.step > summary { cursor: pointer; padding: 4px 0; }
.agent-stat { border-left: 4px solid var(--agent); padding-left: 4px; }
.rollout { margin: 10px 0 16px; }
details.node { border-left: 4px solid var(--agent); margin: 6px 0 6px 0; padding: 2px 0 2px 10px; background: var(--bg); }
details.node.sub { margin-left: 8px; background: var(--soft); }
details.node.hidden { display: none; }
details.node > summary { cursor: pointer; }
.agent { font-weight: 700; color: var(--agent); }
.traj { color: var(--muted); font-size: 12px; }
.num { font-variant-numeric: tabular-nums; margin-left: 6px; }
.fate, .slots, .frozen, .error { font-size: 12px; border-radius: 10px; padding: 0 7px; margin-left: 4px; border: 1px solid var(--line); }
.fate-kept { background: #e6f4ea; } .fate-duplicated { background: #fff4d6; } .fate-dropped { background: #fde2e1; }
.error { background: #fde2e1; }
dl.fields { display: grid; grid-template-columns: max-content 1fr; gap: 0 10px; margin: 4px 0; font-size: 12px; color: var(--muted); }
dl.fields dt { font-weight: 600; } dl.fields dd { margin: 0; overflow-wrap: anywhere; }
ol.turns { list-style: none; padding: 0; margin: 4px 0; }
li.turn { margin: 4px 0; padding: 4px 8px; border-radius: 4px; }
li.turn.model { background: #eef4fb; } li.turn.env { background: #f6f1e7; }
li.delegations { margin: 4px 0; padding: 2px 0; }
.turn-head { font-size: 11px; color: var(--muted); text-transform: uppercase; letter-spacing: .03em; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 2px 0; max-height: 24em; overflow: auto;
      font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
ul.calls { margin: 4px 0; padding-left: 18px; }
li.call .tool { font-weight: 700; } li.call.bad { color: #b00020; }
pre.args { background: var(--bg); border: 1px solid var(--line); padding: 2px 6px; }
details.prompt > summary { font-size: 12px; color: var(--muted); cursor: pointer; }
"""  # noqa: E501 (CSS rules, one a line)
