"""The tutorial walk (blocklab/inspect/trace/walk.py, ``blocklab trace --walk``): the tutorials' worked model
(preset tutorial) with weights from a JSON file, every printed number checked against a float64 forward
written with plain torch ops in tests/tutorial_walk.py (no blocklab code), in the tutorials' order."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from tutorial_walk import DECIMALS, SENTENCE, TOKENS, hand_walk, weights

from blocklab.cli import main

# the model runs in float32: each printed number is the float64 one to 5e-7 (the rounding of 6 decimals)
# plus float32's error through one block, under 2e-6 per unit of the number's size here
TOL_ABS, TOL_REL = 5e-7 + 2e-6, 2e-6

HEADING = re.compile(r"^(\d+)\. (.+?)  ")


def parse_walk(text: str) -> dict[str, tuple[list[str], list[str], list[list[float]]]]:
    """Each printed step by its title: its row labels, column labels and numbers (column chunks joined)."""
    steps: dict = {}
    title = None
    for line in text.splitlines():
        found = HEADING.match(line)
        if found:
            title = found.group(2)
            steps[title] = ([], [], [])
            rows_seen = 0
            continue
        if title is None or not line.strip() or line.startswith("─"):
            continue
        labels, columns, numbers = steps[title]
        cells = line.split()
        if cells[0] == "token":  # a chunk's header: its columns, rows again from the first
            columns += cells[1:]
            rows_seen = 0
            continue
        if rows_seen == len(labels):
            labels.append(cells[0])
            numbers.append([])
        numbers[rows_seen] += [float(c) for c in cells[1:]]
        rows_seen += 1
    return steps


def walk_text(tmp_path: Path, capsys) -> tuple[str, dict[str, torch.Tensor]]:
    w = weights()
    path = tmp_path / "tutorial.json"
    path.write_text(json.dumps({k: v.tolist() for k, v in w.items()}))
    assert main(["trace", "--preset", "tutorial", "--input", SENTENCE, "--weights", str(path), "--walk",
                 "--decimals", str(DECIMALS), "--width", "100"]) == 0
    return capsys.readouterr().out, hand_walk(w)


def test_every_number_of_the_walk_is_the_hand_computation(tmp_path: Path, capsys) -> None:
    text, expected = walk_text(tmp_path, capsys)
    printed = parse_walk(text)
    assert set(printed) == set(expected)  # every step checked, nothing printed unchecked
    for title, want in expected.items():
        labels, columns, numbers = printed[title]
        got = torch.tensor(numbers, dtype=torch.float64)
        assert got.shape == want.shape, title
        finite = torch.isfinite(want)
        assert torch.equal(torch.isfinite(got), finite), title  # -inf exactly where the mask is
        assert torch.equal(got[~finite], want[~finite]), title
        err = (got - want).abs()[finite]
        assert bool((err <= TOL_ABS + TOL_REL * want.abs()[finite]).all()), (title, float(err.max()))
        if want.shape[0] == 5:
            assert labels == TOKENS, title
    assert printed["block 0: head 0: exp"][1] == TOKENS  # the keys label a score's columns
    assert printed["logits"][1] == ["<PAD>", "<BOS>", "<EOS>", "I", "like", "transformers"]


def test_the_steps_come_in_the_tutorials_order(tmp_path: Path, capsys) -> None:
    text, _ = walk_text(tmp_path, capsys)
    titles = [HEADING.match(line).group(2) for line in text.splitlines() if HEADING.match(line)]
    order = ["token embeddings", "positions", "x0", "block 0: Q, head 0", "block 0: head 0: QK^T",
             "block 0: head 0: scaled", "block 0: head 0: masked", "block 0: head 0: exp",
             "block 0: head 0: row sums", "block 0: head 0: weights", "block 0: head 0: weights @ V",
             "block 0: concatenation", "block 0: Wo", "block 0: residual sum resid_mid", "block 0: ln1: mu",
             "block 0: ln1: var", "block 0: ln1: sqrt(var+eps)", "block 0: ln1: z_hat", "block 0: ln1: gamma",
             "block 0: ln1: beta", "block 0: ln1: output", "block 0: W1 x + b1", "block 0: activation",
             "block 0: W2", "block 0: residual sum resid_post", "block 0: ln2: output", "logits"]
    assert [titles.index(t) for t in order] == sorted(titles.index(t) for t in order)


def test_a_step_wider_than_the_grid_limit_is_summarised(tmp_path: Path, capsys) -> None:
    assert main(["trace", "--preset", "tutorial", "--input", SENTENCE, "--d-ff", "80", "--walk",
                 "--width", "200"]) == 0
    text = capsys.readouterr().out
    hidden = text.split("W1 x + b1")[1].split("\n\n")[0]
    assert "wider than 64: each row's min, mean, max, L2" in hidden and "  min  " in hidden.replace(
        "    ", "  ")


@pytest.mark.parametrize("width", [80, 100])
def test_the_walk_fits_the_terminal(tmp_path: Path, capsys, width: int) -> None:
    assert main(["trace", "--preset", "tutorial", "--input", SENTENCE, "--walk", "--width", str(width)]) == 0
    lines = capsys.readouterr().out.splitlines()
    grids = [line for line in lines if line and not HEADING.match(line) and not line.startswith(
        ("note:", "blocklab trace", "model:", "input:", "means nothing", "predicts"))]
    assert max(len(line) for line in grids) <= width


def test_a_gemma_style_walk_scales_caps_and_windows_as_the_model_does() -> None:
    """Scores divided by sqrt(query_pre_attn_scalar) (1 here: unscaled, as GPT-Neo), soft-capped at 5
    (Gemma 2), block 0 local with a window of 2: the walk's scaled and soft-capped steps by hand from its own
    QK^T, the masked step (the model's scores) equal to the capped ones where a key is seen, and -inf exactly
    outside the causal window; the tracer's sentence says all three."""
    from blocklab.inspect.trace.subject import preset_subject, trace_subject
    from blocklab.inspect.trace.walk import walk_steps

    subject = preset_subject("tiny-lm", 0, {"norm_position": "pre", "layer_windows": (2, None),
                                            "attn_softcap": 5.0, "query_pre_attn_scalar": 1.0})
    with torch.no_grad():
        trace = trace_subject(subject, "<BOS> I like", None, None, None, None)
    steps = {s.title: s.values.double() for s in walk_steps(trace)}
    for block, window in ((0, 2), (1, None)):
        for h in range(2):
            where = f"block {block}: head {h}"
            qk, scaled, capped = (steps[f"{where}: {step}"] for step in ("QK^T", "scaled", "soft-capped"))
            torch.testing.assert_close(scaled, qk / 1.0, rtol=0, atol=0)
            torch.testing.assert_close(capped, 5 * torch.tanh(qk / 5), rtol=1e-12, atol=1e-12)
            i, j = torch.arange(3)[:, None], torch.arange(3)[None]
            seen = (j <= i) & ((j > i - window) if window else True)
            masked = steps[f"{where}: masked"]
            assert bool(torch.isinf(masked[~seen]).all()) and bool(torch.isfinite(masked[seen]).all())
            torch.testing.assert_close(masked[seen], capped[seen], rtol=1e-6, atol=1e-6)
    said = {s.name: s.explanation for s in trace.stages}
    assert "q . k / sqrt(query_pre_attn_scalar = 1) = / 1, soft-capped to 5 tanh(s / 5)" in \
        said["blocks.0.attn.scores"]
    assert "a local layer: each query sees the last 2 keys" in said["blocks.0.attn.scores"]
    assert "local layer" not in said["blocks.1.attn.scores"]


def test_a_soft_capped_head_shows_its_logits_before_the_cap_and_says_the_cap() -> None:
    """A logit soft-cap of 0.5: the stage head.uncapped is the final stream times the head's matrix (float64
    by hand), the logits 2 tanh(x / 2) of it; each sentence names the top token by the vocabulary."""
    from blocklab.inspect.trace.subject import preset_subject, trace_subject

    subject = preset_subject("tiny-lm", 0, {"norm_position": "pre", "logit_softcap": 0.5})
    with torch.no_grad():
        trace = trace_subject(subject, "<BOS> I like", None, None, None, None)
    stages = {s.name: s for s in trace.stages}
    head = subject.model.head.weight.double()  # (V, d)
    uncapped = stages["ln_f"].rows.double() @ head.T + (0 if subject.model.head.bias is None
                                                        else subject.model.head.bias.double())
    torch.testing.assert_close(stages["head.uncapped"].rows.double(), uncapped, rtol=1e-5, atol=1e-5)
    capped = 0.5 * torch.tanh(uncapped / 0.5)
    torch.testing.assert_close(stages["logits"].rows.double(), capped, rtol=1e-5, atol=1e-5)
    assert stages["logits"].rows.abs().max() < 0.5 < uncapped.abs().max()  # the cap acts on these numbers
    top = stages["head.uncapped"].columns[int(uncapped[-1].argmax())]
    assert f"the top one is {top!r}" in stages["head.uncapped"].explanation
    said = "logits: head.uncapped soft-capped, 0.5 * tanh(x / 0.5), inside +-0.5"
    assert stages["logits"].explanation.startswith(said)


def test_the_scores_hover_divides_by_the_models_own_divisor_and_gives_none_for_capped_scores() -> None:
    """query_pre_attn_scalar 4: the scores' record divides q . k by 2, and its terms give the model's scores
    (by hand here); soft-capped scores are no such sum: no record (the hover then shows no formula)."""
    from blocklab.inspect.trace.subject import preset_subject, trace_subject

    def scores(**fields: object):
        subject = preset_subject("tiny-lm", 0, {"norm_position": "pre", **fields})
        with torch.no_grad():
            trace = trace_subject(subject, "<BOS> I like", None, None, None, None)
        return next(s for s in trace.stages if s.name == "blocks.0.attn.scores")

    stage = scores(query_pre_attn_scalar=4.0)
    o = stage.operands
    assert o.scale == 2.0
    total = ((o.x * o.w).sum(-1) + o.rest) / 2.0  # (h, P, T)
    seen = torch.isfinite(stage.heads)
    torch.testing.assert_close(total[seen], stage.heads[seen].to(total.dtype), rtol=1e-5, atol=1e-6)
    assert scores(attn_softcap=5.0).operands is None
