"""``python -m mgrpo_verl.viewer`` on a hand-built run: what it reads, the trees it builds, that every model text is
escaped, and the page in a real headless browser (Chromium): it loads without a script error, its script ran, the
trees are nested as the dump says, and hostile model text stays text.

The hand-built run (``run``): training step 1 with two rollouts of one query and validation step 0 with one.

    traj          agent    parent   score  advantage  fate                 turns
    q/0/main      main     -        1.0    +0.5       kept                 model (calls ask_helper twice) / env / model
    q/0/helper/0  helper   q/0/main 0.75   +0.25      duplicated x1        model: hostile text, one tool call read_a
    q/0/helper/1  helper   q/0/main 0.25   -0.25      dropped, borrowed x2 model: an unreadable tool call
    q/1/main      main     -        0.0    -0.5       kept, borrowed in 2  model
    q/0/evil<...> evil<script>... q/0/main 0  0       kept                 (an agent name that is markup)
    val q/9/main  main     -        0.5    -          -                    model

The main rollout's two ``ask_helper`` calls get helper/0 and helper/1 nested under them, in call order; the
third sub row (agent ``evil...``) was not called by name and sits under "calls" at the end.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from browser import dump_dom, parse

from mgrpo_verl.viewer import load_dump, render_page, write_page
from mgrpo_verl.viewer.__main__ import main as viewer_main
from mgrpo_verl.viewer.page import fate_label, line_chart, spread

PAYLOAD = ("<script>document.title='PWNED'</script>"
           "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">")
EVIL_AGENT = "evil<script>document.title='PWNED'</script>"


def turn(role, text, **kw):
    return {"role": role, "text": text, "tokens": len(text), **kw}


def row(step, split, key, traj, parent, agent, score, advantage=None, fate=None, turns=(), **kw):
    return {"step": step, "split": split, "key": key, "uid": "q", "traj_id": traj, "parent_traj_id": parent,
            "agent": agent, "score": score, "advantage": advantage, "fate": fate, "calls": 2, "failed_calls": 0,
            "prompt": f"prompt of {traj} {PAYLOAD}", "prompt_tokens": 12, "turns": list(turns), **kw}


ASK = [{"name": "ask_helper", "arguments": {"task": "first " + PAYLOAD}}, {"name": "ask_helper", "arguments": {"task": "second"}}]
TRAIN = [
    row(1, "train", "q_0_3", "q/0/main", "", "main", 1.0, 0.5, {"kind": "kept", "d_max": 2},
        [turn("model", "I will ask", tool_calls=ASK), turn("env", "Helper said: 7 | 8"), turn("model", "7")],
        trainable=True, ground_truth=PAYLOAD, reward_extra_info={"acc": 1.0, "note": PAYLOAD}),
    row(1, "train", "q_0_0", "q/0/helper/0", "q/0/main", "helper", 0.75, 0.25, {"kind": "duplicated", "copies": 1, "borrowed": 0},
        [turn("model", PAYLOAD, tool_calls=[{"name": "read_a", "arguments": {"x": PAYLOAD}}])], trainable=True),
    row(1, "train", "q_0_1", "q/0/helper/1", "q/0/main", "helper", 0.25, -0.25, {"kind": "dropped", "copies": 0, "borrowed": 2},
        [turn("model", "x", tool_calls=[{"name": "", "error": "<error: malformed>", "raw": PAYLOAD}])], trainable=True),
    row(1, "train", "q_0_2", "q/0/evil/0", "q/0/main", EVIL_AGENT, 0.0, 0.0, {"kind": "kept"}, [turn("model", "hi")],
        trainable=False),
    row(1, "train", "q_1_0", "q/1/main", "", "main", 0.0, -0.5, {"kind": "kept", "borrowed_in": {"helper": 2}},
        [turn("model", "no call")], trainable=True),
]
VAL = [row(0, "val", "v_0_0", "q/9/main", "", "main", 0.5, turns=[turn("model", "5")])]


@pytest.fixture
def run(tmp_path) -> Path:
    root = tmp_path / "run"
    (root / "rollouts").mkdir(parents=True)
    (root / "validation" / "agents").mkdir(parents=True)
    (root / "rollouts" / "1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in TRAIN) + "not json\n{\"step\": 1}\n")
    (root / "validation" / "agents" / "0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in VAL))
    # verl's own validation dump beside ours: not our schema, left out
    (root / "validation" / "0.jsonl").write_text(json.dumps({"input": "i", "output": "o", "score": 1.0, "step": 0}) + "\n")
    return root


def test_load_dump_reads_our_rows_only(run):
    dump = load_dump(run)
    assert [p.relative_to(run).as_posix() for p in dump.files] == ["rollouts/1.jsonl", "validation/agents/0.jsonl"]
    assert len(dump.rows) == 6 and dump.steps("train") == [1] and dump.steps("val") == [0]
    assert len(dump.skipped) == 2 and "not JSON" in dump.skipped[0] and "lacks" in dump.skipped[1]
    assert dump.agents() == ["main", EVIL_AGENT, "helper"]  # agents with main rows first


def test_spread_and_labels():
    rows = [{"key": str(i), "score": s} for i, s in enumerate([0.1, 0.9, 0.5, 0.3, 0.7])]
    assert [r["score"] for r in spread(rows, 3)] == [0.9, 0.5, 0.1]  # best, median, worst
    assert [r["score"] for r in spread(rows, 1)] == [0.9]
    assert len(spread(rows, 9)) == 5
    assert fate_label({"kind": "dropped", "copies": 0, "borrowed": 2}) == "dropped, borrowed x2"
    assert fate_label({"kind": "duplicated", "copies": 1}) == "duplicated x1" and fate_label(None) == ""


def test_every_text_is_escaped_and_the_page_is_self_contained(run):
    page = render_page(load_dump(run), title=f"t {PAYLOAD}")
    assert page.count("<script>") == 2  # the error hook and the page's script: none from the dump
    assert "PWNED" in page and "document.title='PWNED'</script>" not in page.replace("&lt;/script&gt;", "")
    assert "<img" not in page and "&lt;img src=x onerror=" in page
    # nothing is fetched: no element with a src or href, no URL
    assert not re.search(r"<[a-z]+[^>]*\s(src|href)=", page) and "http://" not in page and "https://" not in page


def test_chart_of_one_point_and_of_none():
    one = line_chart("c", {"a<b>": [(3, 0.5)]}, {"a<b>": "#000"})
    assert "<circle" in one and "a&lt;b&gt;" in one and "<polyline" not in one
    assert "no data" in line_chart("c", {}, {})


def test_cli_writes_the_page(run, capsys):
    assert viewer_main([str(run)]) == 0
    out = run / "rollouts.html"
    assert out.is_file() and "wrote" in capsys.readouterr().out
    assert viewer_main([str(run / "validation" / "agents"), "--out", str(run / "v.html"), "--rollouts", "1"]) == 0
    empty = run / "empty"
    empty.mkdir()
    assert viewer_main([str(empty)]) == 1 and "no rollout dump" in capsys.readouterr().err


def test_page_in_a_headless_browser(run, tmp_path):
    page = write_page(load_dump(run), tmp_path / "page.html", title="hand-built run")
    dom = dump_dom(page, tmp_path / "profile")
    nodes = parse(dom)
    assert nodes.root.get("data-js-errors") == "0", re.findall(r'<pre id="js-errors"[^>]*>(.*?)</pre>', dom, re.S)
    assert nodes.body.get("data-ready") == "1"  # the page's script ran to its end
    assert nodes.status == "3 rollout trees, 6 rows shown"  # 5 training rows, 1 validation row
    # the trees as the dump says: the helper's calls under their main rollout, the other sub row too
    assert nodes.parent == {"q/0/main": None, "q/0/helper/0": "q/0/main", "q/0/helper/1": "q/0/main",
                            "q/0/evil/0": "q/0/main", "q/1/main": None, "q/9/main": None}
    assert nodes.agent["q/0/evil/0"] == EVIL_AGENT
    # hostile text stayed text: no script of it ran, no element of it exists
    assert "<title>hand-built run</title>" in dom and "PWNED</title>" not in dom
    assert 'data-pwned="1"' not in dom and "<img" not in dom
    assert "&lt;img src=x onerror=" in dom and "&lt;script&gt;document.title='PWNED'&lt;/script&gt;" in dom
    # the first ask_helper call holds helper/0: its arguments, then the node
    first_call = dom.index("first &lt;script&gt;")
    assert first_call < dom.index('data-traj="q/0/helper/0"') < dom.index("second") < dom.index('data-traj="q/0/helper/1"')


def test_the_error_hook_counts_script_errors(run, tmp_path):
    """The control of the check above: a page whose script fails shows it on ``data-js-errors``."""
    page = render_page(load_dump(run)).replace("</body>", "<script>null.boom();</script></body>")
    path = tmp_path / "broken.html"
    path.write_text(page, encoding="utf-8")
    nodes = parse(dump_dom(path, tmp_path / "profile"))
    assert nodes.root.get("data-js-errors") == "1"
