"""The character-level language model blocklab ships (cli/defaults.py SHIPPED_LM, issue 40 item 4): made by
scripts/ship_char_lm.py with its settings, from preset char-lm, and trained: it predicts held-out Coriolanus
far better than the text's own character frequencies (the oracle, counted here) and its training never saw
that part.
"""

from __future__ import annotations

import importlib.util
import math
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

from blocklab.cli.defaults import SHIPPED_LM
from blocklab.nn.presets import preset
from blocklab.tasks import get_task
from blocklab.tasks.base import IGNORE_INDEX
from blocklab.weights.load import load

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("ship_char_lm", ROOT / "scripts" / "ship_char_lm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_the_shipped_model_is_what_the_script_makes_from_preset_char_lm() -> None:
    """Its config is the preset's, its training settings the script's flags, its task the text task's, and
    the script writes where the commands look."""
    script = _script()
    loaded = load(SHIPPED_LM)
    assert loaded.model.config == preset("char-lm")
    train, task = loaded.meta["train"], loaded.meta["task"]
    args = script.TRAIN_ARGS
    assert task["name"] == _flag(args, "--task") == "text" and task["path"] is None  # the shipped text
    assert loaded.meta["step"] == train["steps"] == int(_flag(args, "--steps")) == script.STEPS
    for flag, field in [("--warmup", "warmup"), ("--batch-size", "batch_size"), ("--seed", "seed")]:
        assert train[field] == int(_flag(args, flag))
    assert train["lr"] == float(_flag(args, "--lr"))
    assert script.SHIPPED_LM == SHIPPED_LM and SHIPPED_LM.is_file()


def test_it_predicts_held_out_text_far_better_than_the_character_frequencies() -> None:
    """Cross-entropy on the held-out part (never trained on) against the entropy of the training part's
    character frequencies, a model that knows letters but not words: at least 0.8 nats per character lower
    (measured: 2.01 against 3.29)."""
    loaded = load(SHIPPED_LM)
    task = get_task("text", seed=loaded.meta["task"]["seed"], seq_len=loaded.meta["task"]["seq_len"])
    held_out = task.split("test")
    model = loaded.model.eval()
    with torch.no_grad():
        logits = model(held_out.inputs)  # (N, T, V)
    targets = held_out.targets.flatten()
    loss = F.cross_entropy(logits.flatten(0, 1).double(), targets, ignore_index=IGNORE_INDEX)
    text = task.text[: task.boundary]
    counts = Counter(text)
    unigram = -sum(n / len(text) * math.log(n / len(text)) for n in counts.values())  # nats per character
    assert unigram - loss.item() > 0.8, (loss.item(), unigram)
    scored = held_out.targets != IGNORE_INDEX
    assert scored.sum() >= len(task.text) - task.boundary - 1  # every held-out character after the first
