"""The tutorial walk (blocklab/inspect/trace/walk.py, ``blocklab trace --walk``): the tutorials' worked model
(preset tutorial) with weights from a JSON file, every printed number checked against a float64 forward
written here with plain torch ops (no blocklab code), step by step in the tutorials' order."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from blocklab.cli import main

SENTENCE = "<BOS> I like transformers <EOS>"
TOKENS = SENTENCE.split()
IDS = [1, 3, 4, 5, 2]  # tiny-lm's vocabulary: <PAD> <BOS> <EOS> I like transformers
D, H, DK, DFF, V, EPS = 16, 2, 8, 64, 6, 1e-5
DECIMALS = 6
# the model runs in float32: each printed number is the float64 one to 5e-7 (the rounding of 6 decimals)
# plus float32's error through one block, under 2e-6 per unit of the number's size here
TOL_ABS, TOL_REL = 5e-7 + 2e-6, 2e-6


def weights(seed: int = 7) -> dict[str, torch.Tensor]:
    """The tutorial model's weights by stage, float32 values (what the model holds) as float64."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 0.5) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).float().double()

    w = {"embedding": r(V, D, scale=1.0), "W_vocab": r(V, D), "blocks.0.attn.bo": r(D),
         "blocks.0.ffn.W1": r(DFF, D), "blocks.0.ffn.b1": r(DFF), "blocks.0.ffn.W2": r(D, DFF, scale=0.2),
         "blocks.0.ffn.b2": r(D)}
    for m in "qkv":
        for h in range(H):
            w[f"blocks.0.attn.W{m}.h{h}"], w[f"blocks.0.attn.b{m}.h{h}"] = r(DK, D, scale=0.25), r(DK)
    for h in range(H):
        w[f"blocks.0.attn.Wo.h{h}"] = r(D, DK)
    for ln in ("ln1", "ln2"):
        w[f"blocks.0.{ln}.gamma"], w[f"blocks.0.{ln}.beta"] = 1 + r(D, scale=0.1), r(D, scale=0.1)
    return w


def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, name: str,
               out: dict) -> torch.Tensor:
    mu = x.sum(-1) / D
    var = ((x - mu[:, None]) ** 2).sum(-1) / D
    denom = torch.sqrt(var + EPS)
    z_hat = (x - mu[:, None]) / denom[:, None]
    y = gamma * z_hat + beta
    out.update({f"{name}: input": x, f"{name}: mu": mu[:, None], f"{name}: var": var[:, None],
                f"{name}: sqrt(var+eps)": denom[:, None],
                f"{name}: z_hat": z_hat, f"{name}: gamma": gamma[None], f"{name}: beta": beta[None],
                f"{name}: output": y})
    return y


def hand_walk(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every step of the walk by hand, float64, by its title."""
    out: dict[str, torch.Tensor] = {}
    tok = w["embedding"][IDS]
    pe = torch.zeros(5, D, dtype=torch.float64)
    for p in range(5):
        for i in range(D // 2):
            pe[p, 2 * i] = math.sin(p / 10000 ** (2 * i / D))
            pe[p, 2 * i + 1] = math.cos(p / 10000 ** (2 * i / D))
    x = tok + pe
    out.update({"token embeddings": tok, "positions": pe, "x0": x})
    qkv = {m: [x @ w[f"blocks.0.attn.W{m}.h{h}"].T + w[f"blocks.0.attn.b{m}.h{h}"] for h in range(H)]
           for m in "qkv"}
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    heads = []
    for h in range(H):
        for m in "qkv":
            out[f"block 0: {m.upper()}, head {h}"] = qkv[m][h]
        s = qkv["q"][h] @ qkv["k"][h].T
        scaled = s / math.sqrt(DK)
        masked = scaled.masked_fill(mask, float("-inf"))
        e = torch.exp(masked)
        sums = e.sum(-1)
        a = e / sums[:, None]
        heads.append(a @ qkv["v"][h])
        out.update({f"block 0: head {h}: QK^T": s, f"block 0: head {h}: scaled": scaled,
                    f"block 0: head {h}: masked": masked, f"block 0: head {h}: exp": e,
                    f"block 0: head {h}: row sums": sums[:, None], f"block 0: head {h}: weights": a,
                    f"block 0: head {h}: weights @ V": heads[h]})
    concat = torch.cat(heads, dim=1)
    wo = torch.cat([w["blocks.0.attn.Wo.h0"], w["blocks.0.attn.Wo.h1"]], dim=1)
    attn = concat @ wo.T + w["blocks.0.attn.bo"]
    r1 = x + attn
    out.update({"block 0: concatenation": concat, "block 0: Wo": attn, "block 0: residual sum resid_mid": r1})
    y = layer_norm(r1, w["blocks.0.ln1.gamma"], w["blocks.0.ln1.beta"], "block 0: ln1", out)
    hidden = y @ w["blocks.0.ffn.W1"].T + w["blocks.0.ffn.b1"]
    act = torch.clamp(hidden, min=0)
    f = act @ w["blocks.0.ffn.W2"].T + w["blocks.0.ffn.b2"]
    r2 = y + f
    out.update({"block 0: W1 x + b1": hidden, "block 0: activation": act, "block 0: W2": f,
                "block 0: residual sum resid_post": r2})
    z = layer_norm(r2, w["blocks.0.ln2.gamma"], w["blocks.0.ln2.beta"], "block 0: ln2", out)
    logits = z @ w["W_vocab"].T
    probs = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    out.update({"logits": logits, "probabilities": probs})
    return out


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
