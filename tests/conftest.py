"""Shared test settings: deterministic seeds, no hub downloads."""

import os
import signal
from collections.abc import Callable, Iterator

import pytest
import torch
from hypothesis import settings

# 20x every property test's examples (fuzzing.examples), by hand: pytest --hypothesis-profile=thorough.
# Not in CI, where hypothesis loads its own "ci" profile (derandomized: the same cases every run).
settings.register_profile("thorough", max_examples=2000, deadline=None)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_main_run(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The README's run (runs/listops after `make train`) is the developer's, not the tests': trace and
    explore look for it where there is none; a test that wants one points ``MAIN_RUN`` at its own."""
    import blocklab.cli.defaults

    absent = tmp_path_factory.getbasetemp() / "no-run" / "listops"
    monkeypatch.setattr(blocklab.cli.defaults, "MAIN_RUN", absent)


@pytest.fixture
def main_run_folder(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """The README's main run, trained here for a few steps (``blocklab train``), where trace and explore
    look for it (``MAIN_RUN``); its folder."""
    import blocklab.cli.defaults
    from blocklab.cli import main

    run = tmp_path / "runs" / "listops"
    assert main(["train", "--out", str(run), "--steps", "3", "--no-report", "-q"]) == 0
    monkeypatch.setattr(blocklab.cli.defaults, "MAIN_RUN", run)
    return run


@pytest.fixture
def ctrl_c() -> Iterator[Callable[..., Callable[[object], None]]]:
    """Ctrl-C as a terminal delivers it, whatever the suite was launched from.

    A suite started in the background by a non-interactive shell (``cmd &``, nohup) begins with
    SIGINT ignored: Python keeps an ignored SIGINT ignored and child processes inherit it, and
    blocklab rightly leaves an ignored SIGINT alone (a grid worker relies on that). So a test of
    Ctrl-C installs Python's default handler for its duration; children it starts then begin with
    the default disposition. Yields ``at_step(step, times=1)``: a ``train()`` callback that sends
    SIGINT to this process ``times`` times during that step.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    def at_step(step: int, times: int = 1) -> Callable[[object], None]:
        def callback(ctx: object) -> None:  # Ctrl-C arriving during a step
            if ctx.step == step:
                for _ in range(times):
                    os.kill(os.getpid(), signal.SIGINT)

        return callback

    try:
        yield at_step
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture
def tiny_gpt2_folder(tmp_path):
    """A Hugging Face folder of a random one-layer GPT-2 (d 16) with a byte-level BPE tokenizer trained
    here on ``TINY_GPT2_TEXT`` (no network); yields (folder, the tokenizer)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([TINY_GPT2_TEXT] * 10, vocab_size=280, min_frequency=1,
                           special_tokens=["<|endoftext|>"])
    folder = tmp_path / "gpt2-tiny"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(bpe._tokenizer.to_str())
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=16, n_embd=16, n_layer=1,
                                     n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder, bpe


TINY_GPT2_TEXT = "The cat sat on the mat. The dog sat on the log."
