"""The explore page (blocklab/explore/static) in a real browser: Playwright driving Debian's headless
Chromium (/usr/bin/chromium; skipped when it or Playwright is missing) against ``blocklab explore``
running as a process. The numbers the page shows are compared with ``blocklab trace --json`` and the
hook API, computed here independently."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import blocklab as bl
from blocklab.cli import main
from blocklab.tasks import get_task

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it: "
                                                          "scripts/ensure-chromium.sh)")
TOKENIZER = get_task("listops").tokenizer
TYPED = "Min ( 3 , 9 , 4 )"
RENDERED = ("document.documentElement.dataset.rendered && "
            "document.documentElement.dataset.rendered !== 'error'")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """``blocklab explore`` over two presets and their pre-norm variants on a free port; its URL."""
    proc = subprocess.Popen([sys.executable, "-m", "blocklab", "explore", "--preset", "listops-seed",
                             "--preset", "tiny-lm", "--vary", "norm_position=post,pre",
                             "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        found = re.search(r"http://\S+", line)
        assert found, line + proc.stdout.read() if proc.poll() is not None else line
        yield found.group(0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def page(server: str) -> Iterator[object]:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        tab.errors = []
        tab.on("console", lambda m: tab.errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: tab.errors.append(str(e)))
        tab.goto(server)
        tab.wait_for_function(RENDERED, timeout=60_000)
        yield tab
        browser.close()


def shown_tokens(tab: object) -> list[str]:
    return tab.eval_on_selector_all("#tokens .tok", "els => els.map(e => e.childNodes[1].textContent)")


def test_typing_retraces_and_the_page_shows_the_trace_jsons_numbers(page: object, tmp_path: Path) -> None:
    page.focus("#model")
    page.keyboard.press("Tab")  # model, compare, input: the page is used from the keyboard
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "input"
    page.keyboard.press("Control+A")
    page.keyboard.type(TYPED)
    page.wait_for_function(f"({RENDERED}) && Array.from(document.querySelectorAll('#tokens .tok'))"
                           f".map(e => e.childNodes[1].textContent).join(' ') === {json.dumps(TYPED)}",
                           timeout=60_000)
    out = tmp_path / "trace.json"
    assert main(["trace", "--preset", "listops-seed", "--input", TYPED, "--json", str(out), "-q"]) == 0
    stages = {s["name"]: s for s in json.loads(out.read_text())["stages"]}
    cells = page.eval_on_selector_all(
        "td[data-stat]",
        "els => els.map(e => [e.dataset.stage, e.dataset.stat, +e.dataset.position, e.textContent])")
    assert {c[0] for c in cells} >= {"blocks.0.resid_pre", "blocks.0.ln1", "blocks.0.ffn.hidden",
                                     "blocks.0.ln2"}
    for stage, stat, position, text in cells:
        record = stages[stage]
        assert float(text) == pytest.approx(record[stat][record["positions"].index(position)], abs=0.5e-4)
    assert len(cells) == 6 * 8 * len({c[0] for c in cells})
    assert page.errors == []


def test_hovering_a_sum_shows_its_operands(page: object, tmp_path: Path) -> None:
    canvas = "#stage-blocks\\.0\\.resid_mid canvas"
    page.locator(canvas).scroll_into_view_if_needed()
    box = page.locator(canvas).bounding_box()
    cell = page.eval_on_selector(canvas, "c => c.cell")
    row, feature = 7, 5
    page.mouse.move(box["x"] + cell["left"] + (feature + 0.5) * cell["cw"],
                    box["y"] + cell["top"] + (row + 0.5) * cell["ch"])
    tip = page.text_content("#tip")
    out = tmp_path / "trace.json"
    assert main(["trace", "--preset", "listops-seed", "--input", "Max ( 1 , 6 , 2 )", "--json", str(out),
                 "-q"]) == 0
    stages = {s["name"]: s for s in json.loads(out.read_text())["stages"]}
    x, f = (stages[f"blocks.0.{n}"]["values"][row][feature] for n in ("resid_pre", "attn.out"))
    assert f"7 ) · feature 5 = {stages['blocks.0.resid_mid']['values'][row][feature]:.4f}" in tip
    assert f"= resid_pre {x:.4f} + attn.out {f:.4f}" in tip  # post-norm: resid_mid = resid_pre + attn.out
    assert page.errors == []


def test_clicking_a_head_ablates_it_with_the_hook_apis_numbers(page: object) -> None:
    page.click("#groups button[data-group='block-1']")
    page.wait_for_selector("#heads button[data-head='2']")
    page.click("#heads button[data-head='2']")
    page.wait_for_function(f"({RENDERED}) && document.querySelector('.bars.ablated')", timeout=60_000)
    rows = page.eval_on_selector_all(".bar.ablated",
                                     "els => els.map(e => [+e.dataset.tokenId, +e.dataset.prob])")

    def zero_head_2(x: torch.Tensor, hook: object) -> torch.Tensor:
        x = x.clone()
        x[:, :, 2] = 0
        return x

    torch.manual_seed(0)
    model = bl.Transformer(bl.preset("listops-seed")).eval()
    with torch.no_grad(), model.hooks({"blocks.1.attn.z": zero_head_2}):
        probs = model(torch.tensor([TOKENIZER.encode("Max ( 1 , 6 , 2 )")]))[0, -1].double().softmax(-1)
    assert len(rows) == 18
    for token, p in rows:
        assert p == pytest.approx(float(probs[token]), abs=1e-9)
    assert page.get_attribute("#heads button[data-head='2']", "aria-pressed") == "true"
    assert page.errors == []


def test_patching_a_head_from_another_input_in_the_page(page: object) -> None:
    page.check("input[name=mode][value=patch]")
    page.fill("#patch-from", "Min ( 3 , 9 , 4 )")
    page.click("#heads button[data-head='0']")
    page.wait_for_function(f"({RENDERED}) && document.querySelector('.bars.ablated')", timeout=60_000)
    rows = page.eval_on_selector_all(".bar.ablated",
                                     "els => els.map(e => [+e.dataset.tokenId, +e.dataset.prob])")
    torch.manual_seed(0)
    model = bl.Transformer(bl.preset("listops-seed")).eval()
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([TOKENIZER.encode("Min ( 3 , 9 , 4 )")]))

    def patch(z: torch.Tensor, hook: object) -> torch.Tensor:
        z = z.clone()
        z[:, :, 0] = cache["blocks.0.attn.z"][:, :, 0]
        return z

    with torch.no_grad(), model.hooks({"blocks.0.attn.z": patch}):
        probs = model(torch.tensor([TOKENIZER.encode("Max ( 1 , 6 , 2 )")]))[0, -1].double().softmax(-1)
    assert len(rows) == 18
    for token, p in rows:
        assert p == pytest.approx(float(probs[token]), abs=1e-9)
    assert "block 0 head 0 patched" in page.text_content("#ablations")
    assert page.errors == []


def test_a_variant_compared_side_by_side_shows_its_own_numbers(page: object) -> None:
    page.select_option("#compare", "listops-seed norm_position=pre")
    page.wait_for_function(f"({RENDERED}) && document.querySelector('.bars.compared')", timeout=60_000)
    rows = page.eval_on_selector_all(".bar.compared",
                                     "els => els.map(e => [+e.dataset.tokenId, +e.dataset.prob])")
    torch.manual_seed(0)  # the same seed, the other layout
    model = bl.Transformer(bl.preset("listops-seed", norm_position="pre")).eval()
    with torch.no_grad():
        probs = model(torch.tensor([TOKENIZER.encode("Max ( 1 , 6 , 2 )")]))[0, -1].double().softmax(-1)
    assert len(rows) == 18
    for token, p in rows:
        assert p == pytest.approx(float(probs[token]), abs=1e-9)
    shared = page.eval_on_selector_all("div.compared", "els => els.map(e => e.parentNode.dataset.stage)")
    assert "blocks.0.ln1" in shared and "blocks.0.attn.q" in shared  # the stages both layouts have
    assert page.errors == []


def test_gradients_label_each_residual_path_on_the_diagram(page: object) -> None:
    page.fill("#target", "6")
    page.wait_for_function(f"({RENDERED}) && document.querySelector('#tokens .tok')", timeout=60_000)
    page.click("#grad")
    page.wait_for_selector("svg#diagram text.grad.identity", timeout=60_000)
    shown = [float(t) for t in page.eval_on_selector_all("svg#diagram text.grad.identity",
                                                         "els => els.map(e => e.textContent)")]
    torch.manual_seed(0)
    model = bl.Transformer(bl.preset("listops-seed")).eval()
    tokens = torch.tensor([TOKENIZER.encode("Max ( 1 , 6 , 2 )")])
    targets = torch.full_like(tokens, -100)
    targets[0, -1] = TOKENIZER.encode("6")[0]
    _, cache = model.run_with_cache(tokens, targets=targets, backward=True)
    # block 0, post-norm with add: the identity path carries dL/d(resid_mid) and dL/d(resid_post) unchanged
    expected = [float(cache.grads[f"blocks.0.{s}"][0, -1].norm()) for s in ("resid_mid", "resid_post")]
    assert shown == pytest.approx(expected, rel=1e-3)
    assert page.errors == []


def test_switching_models_redraws_the_page_for_the_other_model(page: object) -> None:
    page.select_option("#model", "tiny-lm")
    page.wait_for_function(
        f"({RENDERED}) && document.getElementById('source').textContent.includes('tiny-lm')", timeout=60_000)
    assert shown_tokens(page) == ["<BOS>", "I", "like"]
    layout = page.eval_on_selector_all("svg#diagram .node", "els => els.map(e => e.dataset.stage)")
    assert layout[:3] == ["blocks.0.resid_pre", "blocks.0.attn.out", "blocks.0.resid_mid"]  # post-norm
    assert page.errors == []
