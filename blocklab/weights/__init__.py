"""Real weights in and out: one loader for every kind of model path (``load``), Hugging Face folders
<-> blocklab's Transformer (one weight map per family), their tokenizers, and sentence embeddings.

May import: errors, version, device, files, nn, tasks, training.
"""

from .hf_folder import Pretrained, load_pretrained, read_pretrained, resolve_model_dir, save_pretrained
from .hf_map import PretrainedError
from .hf_tokenizer import HFTokenizer

__all__ = [
    "HFTokenizer",
    "Pretrained",
    "PretrainedError",
    "load_pretrained",
    "read_pretrained",
    "resolve_model_dir",
    "save_pretrained",
]
