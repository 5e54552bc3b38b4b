"""Tests for blocklab.training.report: a self-contained page whose numbers come from the run."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

import blocklab as bl
from blocklab.inspect.diagnostics import DiagnosticsLogger
from blocklab.tasks import get_task
from blocklab.training.loop import TrainConfig, train
from blocklab.training.report import attention_figure, per_layer, series, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """Collects what a self-contained page must not have (external references) and what it shows."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.external: list[str] = []
        self.headings: list[str] = []
        self.cells: list[str] = []
        self._tag = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._tag = tag
        a = dict(attrs)
        if tag == "img":
            self.images.append(a.get("src") or "")
        for key in ("src", "href"):
            if a.get(key) and not a[key].startswith("data:"):
                self.external.append(a[key])

    def handle_data(self, data: str) -> None:
        if self._tag == "h2":
            self.headings.append(data.strip())
        if self._tag == "td":
            self.cells.append(data.strip())


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    task = get_task("listops")
    config = bl.preset("listops-seed", **task.config_overrides(), d_model=16, n_heads=2, n_layers=2, d_ff=32)
    out = tmp_path_factory.mktemp("report") / "run"
    c = TrainConfig(steps=20, batch_size=16, log_every=5, eval_every=10, target_accuracy=None)
    result = train(config, c, task, out, callbacks=[DiagnosticsLogger(10)], report=False)
    return out, result


def test_report_is_one_self_contained_page_with_every_section(run: tuple[Path, object]) -> None:
    out, _ = run
    path = write_report(out)
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    assert page.external == []
    assert len(page.images) == 5  # curves, gradient norms, gradient flow, LayerNorm inputs, attention
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG_MAGIC
    assert page.headings == [
        "Loss and accuracy",
        "Gradient norm per layer",
        "Gradient flow: residual stream, identity vs branch path",
        "LayerNorm input statistics",
        "Attention on held-out examples",
        "Final config",
    ]
    config = json.loads((out / "config.json").read_text())
    for key, value in config["model"].items():  # the final config, every field, as stored
        shown = page.cells[page.cells.index(key) + 1]
        assert shown == (
            "null" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)
        )


def test_report_without_diagnostics_says_how_to_record_them(run: tuple[Path, object], tmp_path: Path) -> None:
    out, _ = run
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "config.json").write_text((out / "config.json").read_text())
    (tmp_path / "metrics.jsonl").write_text("\n".join(ln for ln in lines if '"diag"' not in ln) + "\n")
    text = write_report(tmp_path, model=run[1].model).read_text()
    assert "--log-diagnostics K" in text and text.count("<img") == 3


def test_curves_and_layer_profiles_are_read_from_the_metrics(run: tuple[Path, object]) -> None:
    out, result = run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert series(rows, "eval_accuracy") == (
        [10, 20],
        [r["eval_accuracy"] for r in rows if "eval_accuracy" in r],
    )
    steps, layers = per_layer(rows, "ln1_in_var")
    assert steps == [1, 10, 20] and len(layers) == 2  # DiagnosticsLogger(10) measures step 1 and every 10th
    diag_rows = [r["diag"] for r in rows if "diag" in r]
    assert layers[1] == [d["ln1_in_var"][1] for d in diag_rows]
    # the gradient norms in the log equal the norms of the parameters' gradients, layer by layer
    keys = sorted(k for k in rows[-1] if k.startswith("grad_norm/"))
    assert keys == ["grad_norm/blocks.0", "grad_norm/blocks.1", "grad_norm/embed", "grad_norm/head"]


def test_attention_maps_and_answers_are_the_models(run: tuple[Path, object]) -> None:
    _, result = run
    task = get_task("listops")
    _, answers = attention_figure(result.model, task, n=3)
    test = task.split("test")
    model = result.model.eval()
    with torch.no_grad():
        predicted = model(test.inputs[:3])[:, 7].argmax(-1)
    for i, answer in enumerate(answers):
        assert answer["input"] == task.tokenizer.decode(test.inputs[i])
        assert answer["predicted"] == task.tokenizer.decode([int(predicted[i])])
        assert answer["expected"] == task.tokenizer.decode([int(test.targets[i, 7])])
        assert answer["correct"] == ("yes" if answer["predicted"] == answer["expected"] else "no")


def test_the_report_and_blocklab_train_print_the_same_tokens_per_second(tmp_path: Path, capsys) -> None:
    from blocklab.cli import main

    out = tmp_path / "run"
    # a log window that does not divide the run: the mean of the windows' rates would differ
    assert main(["train", "--task", "tiny-lm", "--steps", "7", "--warmup", "1", "--log-every", "3",
                 "--out", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    cli_rate = printed.split(" tokens/s")[0].rsplit(" ", 1)[1]  # "... 2.1 s, 12,345 tokens/s; run folder"
    page = Page()
    page.feed((out / "report.html").read_text())
    shown = page.cells[page.cells.index("tokens/s (training)") + 1]
    assert shown == cli_rate and shown.replace(",", "").isdigit()
    from blocklab.training.runfiles import read_metrics

    windows = [r["tokens_per_s"] for r in read_metrics(out) if "tokens_per_s" in r]
    assert len(windows) == 2  # steps 3 and 6 (step 7 is outside every full window)


def test_attention_maps_share_one_colour_scale_per_layer_with_a_colorbar(run: tuple[Path, object]) -> None:
    _, result = run
    task = get_task("listops")
    model = result.model.eval()
    fig, _ = attention_figure(model, task, n=2)
    x = task.split("test").inputs[:2]
    _, cache = model.run_with_cache(x, names="*attn.weights")
    L, H = model.config.n_layers, model.config.n_heads
    assert len(fig.subfigs) == 2
    for e, panel in enumerate(fig.subfigs):
        maps = [ax for ax in panel.axes if ax.get_title()]
        bars = [ax for ax in panel.axes if not ax.get_title()]
        titles = [f"layer {i} · head {h}" for i in range(L) for h in range(H)]
        assert [ax.get_title() for ax in maps] == titles
        assert len(bars) == L  # one colorbar per layer
        keep = [t for t, token in enumerate(x[e].tolist()) if token != task.tokenizer.pad_id]
        for i in range(L):
            weights = cache[f"blocks.{i}.attn.weights"][e][:, keep][:, :, keep]  # (h, T, T)
            for h in range(H):
                image = maps[i * H + h].images[0]
                shown = torch.as_tensor(image.get_array().data)
                torch.testing.assert_close(shown, weights[h], rtol=0, atol=0)
                assert image.get_clim() == (0, float(weights.max()))  # the layer's scale, not the head's
            assert bars[i].get_ylim() == pytest.approx((0, float(weights.max())))
        labels = [t for ax in maps for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]
        assert labels and min(t.get_fontsize() for t in labels) >= 8
    # the heads of a layer differ in their largest weight, so a scale per head would differ from this one
    first = cache["blocks.0.attn.weights"][0]
    assert first.amax(dim=(-1, -2)).unique().numel() == H
