"""Train the character-level language model blocklab ships, and write its checkpoint into the package.

The model is preset ``char-lm`` trained on the text task's own text (the opening of Coriolanus, 60
characters) by ``blocklab train`` with ``TRAIN_ARGS``; its checkpoint (weights, config, character
vocabulary, the training settings and the held-out evaluation in its header) becomes
``blocklab/tasks/data/coriolanus-char-lm.safetensors``, which ``blocklab trace`` and ``blocklab explore``
open when nothing is named and the README's run does not exist (blocklab/cli/defaults.py). About a minute
on 2 idle cores; tests/cli/test_shipped_lm.py checks the shipped file was made with these settings.

    .venv/bin/python scripts/ship_char_lm.py [--out PATH]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blocklab.cli.defaults import SHIPPED_LM  # noqa: E402
from blocklab.cli.main import main as blocklab  # noqa: E402
from blocklab.files.atomic import atomic_write_bytes  # noqa: E402
from blocklab.weights.load import load  # noqa: E402

STEPS = 1500
# every setting that differs from `blocklab train`'s defaults for the text task; the seed fixes the rest
TRAIN_ARGS = ["train", "--task", "text", "--preset", "char-lm", "--steps", str(STEPS), "--warmup", "50",
              "--batch-size", "32", "--lr", "0.003", "--seed", "0", "--threads", "2"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SHIPPED_LM, help="where the checkpoint goes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        status = blocklab([*TRAIN_ARGS, "--out", folder])
        if status != 0:
            return status
        checkpoint = Path(folder) / "checkpoints" / f"step-{STEPS:06d}" / "model.safetensors"
        atomic_write_bytes(args.out, checkpoint.read_bytes())  # never through a link
    held_out = load(args.out).meta["eval"]
    print(f"{args.out}: held-out loss {held_out['loss']:.4f} nats per character, token accuracy "
          f"{held_out['token_accuracy']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
