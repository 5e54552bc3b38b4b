"""The tutorials' worked model in explore (``--preset tutorial --weights FILE``), in headless Chromium: its
small maps show a number in each cell, and each number drawn is the float64 hand computation of
tests/tutorial_walk.py (plain torch ops, no blocklab code). What the canvas draws is read by recording its
fillText calls (an init script), placed in cells by the map's own geometry (``canvas.cell``)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_page import CHROMIUM, RENDERED, playwright, serving
from tutorial_walk import SENTENCE, hand_walk, weights

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
RECORD = """(() => {  // each canvas keeps the texts drawn on it since it was last cleared
  const C = CanvasRenderingContext2D.prototype, fill = C.fillText, clear = C.clearRect;
  C.clearRect = function (...a) { this.canvas.drawn = []; return clear.apply(this, a); };
  C.fillText = function (t, x, y, ...a) {
    (this.canvas.drawn = this.canvas.drawn || []).push([String(t), x, y]);
    return fill.call(this, t, x, y, ...a);
  };
})();"""
CELLS = """c => { const L = c.cell, out = [];  // the numbers drawn inside the cells, by row and column
  (c.drawn || []).forEach(([t, x, y]) => {
    const col = Math.floor((x - L.left) / L.cw), row = Math.floor((y - L.top) / L.ch);
    if (col >= 0 && col < L.C && row >= 0 && row < L.R && x > L.left) { out.push([row, col, t]); }
  });
  return { numbers: L.numbers, R: L.R, C: L.C, cells: out }; }"""
TOL = 0.5e-4 + 1e-5  # 4 decimals shown; the float32 forward's error is far under 1e-5 at these sizes
REL = 2e-6  # and relative to a large value (an exp near 80: float32's ulp there is 8e-6)


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory: pytest.TempPathFactory):
    w = weights()
    path = tmp_path_factory.mktemp("weights") / "tutorial.json"
    path.write_text(json.dumps({k: v.tolist() for k, v in w.items()}))
    with serving("--preset", "tutorial", "--weights", str(path)) as url, \
            playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        tab = browser.new_page(viewport={"width": 1600, "height": 1000})
        tab.add_init_script(RECORD)
        tab.errors = []
        tab.on("pageerror", lambda e: tab.errors.append(str(e)))
        tab.on("console", lambda m: tab.errors.append(m.text) if m.type == "error" else None)
        tab.goto(url)
        tab.wait_for_function(RENDERED, timeout=60_000)
        tab.fill("#input", SENTENCE)
        tab.wait_for_function(f"({RENDERED}) && document.querySelectorAll('#tokens .tok').length === 5",
                              timeout=60_000)
        yield tab, hand_walk(w)
        browser.close()


def drawn(tab, label: str) -> dict:
    """The numbers drawn in the cells of the map whose aria-label starts with ``label + ':'``."""
    return tab.eval_on_selector(f"canvas[aria-label^={json.dumps(label + ':')}]", CELLS)


def check(found: dict, want: torch.Tensor) -> None:
    assert found["numbers"] and (found["R"], found["C"]) == tuple(want.shape)
    assert len(found["cells"]) == want.numel()  # a number in every cell
    for row, col, text in found["cells"]:
        v = float(want[row, col])
        assert text == "-inf" if v == float("-inf") else abs(float(text) - v) <= TOL + REL * abs(v), \
            (row, col, text, v)


def test_the_tutorial_models_small_maps_show_the_hand_computed_numbers(tutorial) -> None:
    tab, hand = tutorial
    check(drawn(tab, "blocks.0.resid_pre"), hand["x0"])  # the page opens on block 0
    q = torch.cat([hand["block 0: Q, head 0"], hand["block 0: Q, head 1"]], 1)  # heads side by side
    check(drawn(tab, "blocks.0.attn.q"), q)
    for h in range(2):
        check(drawn(tab, f"blocks.0.attn.scores head {h}"), hand[f"block 0: head {h}: masked"])
        check(drawn(tab, f"blocks.0.attn.weights head {h}"), hand[f"block 0: head {h}: weights"])
    check(drawn(tab, "blocks.0.attn.z"), hand["block 0: concatenation"])
    check(drawn(tab, "blocks.0.attn.out"), hand["block 0: Wo"])
    check(drawn(tab, "blocks.0.resid_mid"), hand["block 0: residual sum resid_mid"])
    check(drawn(tab, "blocks.0.ln1"), hand["block 0: ln1: output"])
    check(drawn(tab, "blocks.0.ln2"), hand["block 0: ln2: output"])
    # the steps no stage holds, drawn in their stage's card (issue 40 item 1): the scores' QK^T, scaled,
    # exp and row sums per head, a norm's z_hat, gamma and beta (its mu, var and denominator: its table)
    for h in range(2):
        for step in ("QK^T", "scaled", "exp", "row sums"):
            check(drawn(tab, f"block 0: head {h}: {step}"), hand[f"block 0: head {h}: {step}"])
    for ln in ("ln1", "ln2"):
        for step in ("z_hat", "gamma", "beta"):
            check(drawn(tab, f"block 0: {ln}: {step}"), hand[f"block 0: {ln}: {step}"])
        table = tab.eval_on_selector(  # the norm's own table: pos, token, mu, var, sqrt(var+eps), ...
            f"#stage-blocks\\.0\\.{ln}",
            "s => [...[...s.querySelectorAll('table')]"
            ".filter(t => t.caption.textContent.includes('it used'))[0]"
            ".tBodies[0].rows].map(r => [...r.cells].map(c => c.textContent))")
        assert len(table) == 5
        for p, row in enumerate(table):
            for column, step in ((2, "mu"), (3, "var"), (4, "sqrt(var+eps)")):
                want = float(hand[f"block 0: {ln}: {step}"][p, 0])
                assert abs(float(row[column]) - want) <= TOL + REL * abs(want), (ln, p, step, row, want)
    wide = drawn(tab, "blocks.0.ffn.hidden")  # 64 columns: a heatmap, no numbers
    assert not wide["numbers"] and wide["cells"] == [] and wide["C"] == 64
    tab.click("#groups button[data-group='input']")
    tab.wait_for_function(f"({RENDERED}) && document.querySelector('canvas[aria-label^=\"tok:\"]')",
                          timeout=60_000)
    check(drawn(tab, "tok"), hand["token embeddings"])
    check(drawn(tab, "pos"), hand["positions"])
    tab.click("#groups button[data-group='after']")
    tab.wait_for_function(f"({RENDERED}) && document.querySelector('canvas[aria-label^=\"logits:\"]')",
                          timeout=60_000)
    check(drawn(tab, "logits"), hand["logits"])
    assert tab.errors == []


def test_a_derived_step_explains_itself_from_the_keyboard(tutorial) -> None:
    """Tab to the scaled scores of head 1, move with the arrow keys: the tooltip names the cell, its value
    (the hand computation) and the step's formula with sqrt(d_k)."""
    tab, hand = tutorial
    tab.click("#groups button[data-group='block-0']")
    scaled = "canvas[aria-label^=\"block 0: head 1: scaled:\"]"
    tab.wait_for_function(f"({RENDERED}) && document.querySelector('{scaled}')", timeout=60_000)
    canvas = tab.locator('canvas[aria-label^="block 0: head 1: scaled:"]')
    canvas.focus()
    tab.keyboard.press("ArrowDown")
    tab.keyboard.press("ArrowRight")
    tip = tab.inner_text("#tip")
    lines = tip.split("\n")
    assert lines[0] == "block 0: head 1: scaled"
    assert lines[1].startswith("I · I = ")  # row 1 (query I), column 1 (key I)
    value = float(lines[1].rsplit("= ", 1)[1])
    assert abs(value - float(hand["block 0: head 1: scaled"][1, 1])) <= TOL + REL * abs(value)
    assert lines[2] == "Q K^T / sqrt(d_k) = / 2.82843"
    assert tab.errors == []


def test_the_by_hand_panel_draws_a_typed_vectors_steps(tutorial) -> None:
    """The tutorials' [4, 2, 0, -2] through LayerNorm with gamma and beta typed in, then a vector through
    the tutorial model's FFN (the weights from the file): each drawn number against the hand computation."""
    tab, _ = tutorial
    tab.select_option("#bh-what", "norm")
    tab.fill("#bh-vector", "4, 2, 0, -2")
    tab.fill("#bh-gamma", "1 2 1 2")
    tab.fill("#bh-beta", "0, 0, 1, 1")
    tab.click("#bh-go")
    tab.wait_for_selector("#stage-byhand canvas", timeout=60_000)
    x = torch.tensor([[4.0, 2.0, 0.0, -2.0]], dtype=torch.float64)
    z_hat = (x - 1) / math.sqrt(5 + 1e-5)
    check(drawn(tab, "LayerNorm: z_hat"), z_hat)
    gamma, beta = torch.tensor([1.0, 2, 1, 2]), torch.tensor([0.0, 0, 1, 1])
    check(drawn(tab, "LayerNorm: output"), z_hat * gamma + beta)
    tab.select_option("#bh-what", "ffn")
    v = torch.linspace(-1, 1, 16, dtype=torch.float64)
    tab.fill("#bh-vector", ", ".join(f"{float(a):.17g}" for a in v))
    tab.click("#bh-go")
    tab.wait_for_function("document.querySelector('#stage-byhand h4').textContent.includes('FFN')",
                          timeout=60_000)
    w = weights()
    hidden = w["blocks.0.ffn.W1"] @ v + w["blocks.0.ffn.b1"]
    assert drawn(tab, "W1 x + b1")["C"] == 64  # a heatmap at 64 columns
    out = w["blocks.0.ffn.W2"] @ hidden.clamp(min=0) + w["blocks.0.ffn.b2"]
    check(drawn(tab, "W2 h + b2 = FFN(x)"), out[None])
    assert tab.errors == []
