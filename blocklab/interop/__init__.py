"""Real weights in and out: Hugging Face BERT and GPT-2 folders <-> blocklab's Transformer."""

from .layout import PretrainedError
from .pretrained import Pretrained, load_pretrained, read_pretrained, resolve_model_dir, save_pretrained
from .tokenizer import HFTokenizer

__all__ = [
    "HFTokenizer",
    "Pretrained",
    "PretrainedError",
    "load_pretrained",
    "read_pretrained",
    "resolve_model_dir",
    "save_pretrained",
]
