"""Hugging Face tokenizers, read from a model folder and stored inside blocklab checkpoints.

A folder's tokenizer comes from ``tokenizer.json`` (the ``tokenizers`` library's own format), or,
when there is none, from the vocabulary files: ``vocab.txt`` (BERT WordPiece) or ``vocab.json`` +
``merges.txt`` (GPT-2 byte-level BPE). Either way it is kept as ``tokenizer.json`` text, so a
checkpoint's spec is ``{"kind": "hf_tokenizers", "json": <tokenizer.json text>, "special_tokens": {...}}``.
``tokenizer_from_spec`` rebuilds either kind of tokenizer from the spec a checkpoint stores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from ..errors import one_line
from ..files.jsonfiles import object_check, parse_json, read_json_object
from ..files.reading import read_text
from ..nn.tokens import BatchEncoding, id_list, pad_batch
from ..tasks.vocab import Tokenizer
from .tokenizer_regex import check_regexes
from .transformers_tokenizer import ID_LIMIT, TransformersTokenizerCalls

KIND = "hf_tokenizers"
SPECIAL_TOKENS = ("pad_token", "eos_token", "bos_token", "unk_token", "cls_token", "sep_token", "mask_token")
def check_special_tokens(tokens: Any) -> dict[str, str]:
    """Special tokens as a tokenizer spec stores them: an object of SPECIAL_TOKENS names -> token text."""
    if not isinstance(tokens, dict):
        raise ValueError(f"special_tokens must be an object of name -> token text, not {tokens!r:.60}")
    for name, token in tokens.items():
        if name not in SPECIAL_TOKENS:
            raise ValueError(f"special token {name!r:.40} is not one of: {', '.join(SPECIAL_TOKENS)}")
        if not isinstance(token, str):
            raise ValueError(f"special token {name}={token!r:.60} must be the token's text (a string)")
    return dict(tokens)


def _guarded(call: Callable[[], Any], what: str) -> Any:
    """``call()`` with whatever the ``tokenizers`` library raises turned into a ValueError naming
    ``what``: a Rust panic (its regex engine's retry limit) is a BaseException (pyo3's PanicException)."""
    try:
        return call()
    except (KeyboardInterrupt, SystemExit, GeneratorExit, ValueError):
        raise
    except BaseException as error:
        problem = one_line(str(error))[:200] or type(error).__name__
        raise ValueError(f"the tokenizer failed on {what} ({type(error).__name__}: {problem})") from None


def _nonblank(text: str) -> str:
    if not text.strip():
        raise ValueError(f"empty input {text!r}: nothing to tokenize")
    return text


class HFTokenizer(TransformersTokenizerCalls):
    """A ``tokenizers.Tokenizer`` with blocklab's tokenizer interface (``blocklab.nn.tokens.TextTokenizer``),
    and called as ``transformers``' tokenizers are (``TransformersTokenizerCalls``: ``tokenizer(texts,
    padding=True)``, ``batch_decode``, the special tokens' ids). No truncation: ``encode`` returns every id
    of the text, with the special tokens the tokenizer's post-processor adds (BERT: ``[CLS] ... [SEP]``;
    GPT-2: none), as ``transformers``' tokenizers do.
    """

    def __init__(self, json_text: str, special_tokens: dict[str, str] | None = None,
                 default_prepend_bos: bool = True, clean_up_tokenization_spaces: bool = False) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        try:
            self._tok = _Tokenizer.from_str(json_text)
        except Exception as error:  # the library raises its own Exception type
            raise ValueError(f"not a valid tokenizer.json ({error})") from None
        check_regexes(json_text)
        self._tok.no_padding()
        self._tok.no_truncation()
        self.json = json_text
        self.special_tokens = check_special_tokens({} if special_tokens is None else special_tokens)
        if not isinstance(default_prepend_bos, bool):
            raise ValueError(f"default_prepend_bos={default_prepend_bos!r:.40} must be true or false")
        # TransformerLens' default for the model's family (False for GPT-NeoX): whether text gets the BOS
        self.default_prepend_bos = default_prepend_bos
        if not isinstance(clean_up_tokenization_spaces, bool):
            raise ValueError(f"clean_up_tokenization_spaces={clean_up_tokenization_spaces!r:.40} must be "
                             "true or false")
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces  # the folder's (transformers' too)
        self._vocab_size = self._tok.get_vocab_size(with_added_tokens=True)  # O(vocab) per call: ask once
        self._byte_level = _byte_level(self._tok)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._vocab_size

    def token_id(self, token: str | None) -> int | None:
        """The id of a token string, or None when it is not in the vocabulary."""
        return None if token is None else self._tok.token_to_id(token)

    @property
    def pad_id(self) -> int:
        """The pad token's id; without one (GPT-2) the end-of-text token's, else 0."""
        for name in ("pad_token", "eos_token"):
            found = self.token_id(self.special_tokens.get(name))
            if found is not None:
                return found
        return 0

    @property
    def eos_id(self) -> int | None:
        """The end-of-sequence token's id (GPT-2: ``<|endoftext|>``), or None."""
        return self.token_id(self.special_tokens.get("eos_token"))

    @property
    def bos_id(self) -> int | None:
        """The beginning-of-sequence token's id (Llama: ``<s>``), or None."""
        return self.token_id(self.special_tokens.get("bos_token"))

    def encode(self, text: str) -> list[int]:
        """Text -> ids (special tokens included); empty text is a ValueError."""
        text = _nonblank(text)
        return _guarded(lambda: self._tok.encode(text).ids, f"the input {text[:40]!r}")

    def encode_batch(self, texts: Sequence[str], padding: str = "right") -> BatchEncoding:
        """Texts -> (ids (B, T), attention_mask (B, T)), padded with ``pad_id`` on ``padding``'s side."""
        texts = [_nonblank(t) for t in texts]
        encodings = _guarded(lambda: self._tok.encode_batch(texts), f"the inputs {texts[0][:40]!r}, ...")
        return pad_batch([e.ids for e in encodings], self.pad_id, padding)

    # An id beyond the tokenizer's vocabulary is text-less, not an error: a model's config.json may count
    # more rows than its tokenizer has tokens (Pythia's, Qwen's are padded), and transformers decodes such
    # an id to "". Any id the library can take (u32) is read so.

    def tokens(self, ids: Sequence[int] | Tensor) -> list[str]:
        """Ids -> token strings as the vocabulary spells them (``##ing``, ``Ġcat``; "" beyond it)."""
        return [self._tok.id_to_token(i) or "" for i in id_list(ids, ID_LIMIT)]

    def str_tokens(self, ids: Sequence[int] | Tensor) -> list[str]:
        """Each id decoded on its own, special tokens kept (``Ġcat`` -> ``" cat"``; "" beyond the vocab)."""
        single = [[i] for i in id_list(ids, ID_LIMIT)]
        return self._tok.decode_batch(single, skip_special_tokens=False)

    def piece_bytes(self, ids: Sequence[int] | Tensor) -> list[bytes | None]:
        """Each id's bytes where the vocabulary spells bytes (a byte-level BPE's ``âĤ¬`` is
        ``b"\\xe2\\x82\\xac"``, whole or part of a character); None for an added token, beyond the vocabulary,
        or in a tokenizer whose pieces are text."""
        if not self._byte_level:
            return [None] * len(id_list(ids, ID_LIMIT))
        special = set(self._tok.get_added_tokens_decoder())
        return [None if i in special or not spelled else _spelled_bytes(spelled)
                for i, spelled in zip(id_list(ids, ID_LIMIT), self.tokens(ids), strict=True)]

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint spec: ``{"kind": "hf_tokenizers", "json": ..., "special_tokens": ...}``, and
        ``"default_prepend_bos": false`` where the family says so (GPT-NeoX),
        ``"clean_up_tokenization_spaces": true`` where the folder says so."""
        spec: dict[str, Any] = {"kind": KIND, "json": self.json, "special_tokens": dict(self.special_tokens)}
        if not self.default_prepend_bos:
            spec["default_prepend_bos"] = False
        if self.clean_up_tokenization_spaces:
            spec["clean_up_tokenization_spaces"] = True
        return spec

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HFTokenizer:
        """Inverse of ``to_dict``."""
        if d.get("kind") != KIND or not isinstance(d.get("json"), str):
            keys = sorted(d)
            raise ValueError(f"a Hugging Face tokenizer spec needs kind={KIND!r} and 'json'; got keys {keys}")
        return cls(d["json"], d.get("special_tokens"), d.get("default_prepend_bos", True),
                   d.get("clean_up_tokenization_spaces", False))

    def __repr__(self) -> str:
        return f"HFTokenizer(vocab_size={self.vocab_size}, special_tokens={self.special_tokens})"


def _byte_level(tok: Any) -> bool:
    """Whether the tokenizer decodes bytes spelled one character each (GPT-2's ``ByteLevel`` decoder)."""
    if tok.decoder is None:
        return False
    state = parse_json(tok.decoder.__getstate__(), "the tokenizer's decoder", object_check("decoder"))
    return any(part.get("type") == "ByteLevel" for part in state.get("decoders", [state]))


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's spelling of the 256 bytes as characters, inverted: a printable byte is its own character,
    the others (space, controls, ...) are U+0100 onwards in byte order (``Ġ`` is the space)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + n): b for n, b in enumerate(others)}}


BYTE_ALPHABET = _byte_alphabet()


def _spelled_bytes(spelled: str) -> bytes | None:
    """A byte-level piece's bytes, or None when a character is not one of the alphabet's."""
    if any(c not in BYTE_ALPHABET for c in spelled):
        return None
    return bytes(BYTE_ALPHABET[c] for c in spelled)


def _read_json(path: Path) -> dict[str, Any]:
    """A tokenizer's JSON side file (an object), or {} when the folder has none."""
    if not path.exists() and not path.is_symlink():
        return {}
    return read_json_object(path, f"a Hugging Face {path.name}")


def _special_tokens(folder: Path) -> dict[str, str]:
    """Special token strings from special_tokens_map.json / tokenizer_config.json."""
    found: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):  # the map wins
        for key, value in _read_json(folder / name).items():
            if key in SPECIAL_TOKENS:
                text = value.get("content") if isinstance(value, dict) else value
                if isinstance(text, str):
                    found[key] = text
    return found


def _lines(text: str) -> list[str]:
    """The lines of a vocabulary file as the ``tokenizers`` library reads them (``\\n``-separated, a final
    newline ending the last line, ``\\r\\n`` accepted)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _wordpiece_vocab(path: Path) -> dict[str, int]:
    """BERT's vocab.txt: one token a line, its id the line's number (``WordPiece.read_file``)."""
    lines = _lines(read_text(path, "a BERT vocab.txt"))
    vocab = {line.rstrip(): i for i, line in enumerate(lines)}
    if not vocab:
        raise ValueError(f"{path}: holds no tokens; a vocab.txt has one token a line")
    return vocab


def _bpe_vocab(path: Path) -> dict[str, int]:
    """GPT-2's vocab.json: an object of token -> id (an integer >= 0)."""

    def check(vocab: Any) -> str | None:
        bad = [k for k, v in vocab.items() if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0)]
        if bad:
            return f"the id of {bad[0]!r} is {vocab[bad[0]]!r}, not an integer >= 0"
        first: dict[int, str] = {}
        for token, token_id in vocab.items():
            if token_id in first:
                return f"{first[token_id]!r} and {token!r} share the id {token_id}; each token has its own"
            first[token_id] = token
        return None

    vocab = read_json_object(path, "a GPT-2 vocab.json (token -> id)", check)
    if not vocab:
        raise ValueError(f"{path}: holds no tokens")
    return vocab


def _bpe_merges(path: Path) -> list[tuple[str, str]]:
    """GPT-2's merges.txt: a ``#version`` line, then one merge a line, two tokens separated by a space."""
    merges = []
    for number, line in enumerate(_lines(read_text(path, "a GPT-2 merges.txt")), 1):
        if line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise ValueError(f"{path} line {number}: {line[:40]!r} is not two tokens separated by a space")
        merges.append((parts[0], parts[1]))
    return merges


def _present(path: Path) -> bool:
    return path.exists() or path.is_symlink()  # a dangling link is there, and refused when read


def _json_from_vocab_files(folder: Path) -> str | None:
    """tokenizer.json text built from BERT's vocab.txt or GPT-2's vocab.json + merges.txt, each file read
    and checked here (regular, capped, UTF-8, its format) before the ``tokenizers`` library sees it."""
    from tokenizers.implementations import BertWordPieceTokenizer, ByteLevelBPETokenizer

    vocab_txt, vocab_json, merges_txt = folder / "vocab.txt", folder / "vocab.json", folder / "merges.txt"
    if _present(vocab_txt):
        config = folder / "tokenizer_config.json"
        lowercase = _read_json(config).get("do_lower_case", True)
        if not isinstance(lowercase, bool):
            raise ValueError(f"{config}: do_lower_case={lowercase!r} must be true or false")
        source, vocab = vocab_txt, _wordpiece_vocab(vocab_txt)
        build = lambda: BertWordPieceTokenizer(vocab, lowercase=lowercase)
    elif _present(vocab_json) and _present(merges_txt):
        source, vocab, merges = vocab_json, _bpe_vocab(vocab_json), _bpe_merges(merges_txt)
        build = lambda: ByteLevelBPETokenizer(vocab, merges)
    else:
        return None
    try:
        return build().to_str()
    except Exception as error:  # the library raises TypeError ("[SEP] not found") and its own Exception
        problem = one_line(str(error)) or type(error).__name__
        raise ValueError(f"{source}: the tokenizer cannot be built from it ({problem})") from None


def _config_special_tokens(folder: Path, tokenizer: HFTokenizer) -> dict[str, str]:
    """Special tokens config.json names by id (``eos_token_id``: GPT-2 folders have no tokens map)."""
    found: dict[str, str] = {}
    config = _read_json(folder / "config.json")
    for key in ("eos_token", "bos_token", "pad_token"):
        token_id = config.get(f"{key}_id")
        if isinstance(token_id, int) and 0 <= token_id < tokenizer.vocab_size:
            found[key] = tokenizer.tokens([token_id])[0]
    return found


# transformers' GPT-2 tokenizer names <|endoftext|> its unknown, BOS and end token unless the folder says
# otherwise (GPT2Tokenizer's defaults; AutoTokenizer picks it for model_type "gpt2")
GPT2_DEFAULTS = {"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}


def _class_special_tokens(folder: Path, tokenizer: HFTokenizer) -> dict[str, str]:
    """The special tokens transformers' tokenizer class for the folder gives when its files name none."""
    named_class = str(_read_json(folder / "tokenizer_config.json").get("tokenizer_class", ""))
    gpt2 = named_class.startswith("GPT2Tokenizer") or not named_class and \
        _read_json(folder / "config.json").get("model_type") == "gpt2"
    if not gpt2:
        return {}
    return {name: token for name, token in GPT2_DEFAULTS.items() if tokenizer.token_id(token) is not None}


def load_folder_tokenizer(folder: str | Path, default_prepend_bos: bool = True) -> HFTokenizer | None:
    """The tokenizer saved in a Hugging Face model folder, or None when there is none; ``default_prepend_bos``
    is TransformerLens' default for the folder's family.

    Special tokens come from special_tokens_map.json / tokenizer_config.json, else from the ids
    config.json names (GPT-2's ``eos_token_id``: 50256, ``<|endoftext|>``). Every file is read by
    ``blocklab.files`` (a regular file, capped, strict JSON no deeper than its cap): a bad one is one line."""
    folder = Path(folder)
    path = folder / "tokenizer.json"
    if _present(path):
        json_text = read_text(path, "a Hugging Face tokenizer.json")
        parse_json(json_text, str(path), object_check("a Hugging Face tokenizer.json"))
    else:
        json_text = _json_from_vocab_files(folder)
    if json_text is None:
        return None
    special = _special_tokens(folder)
    clean_up = _read_json(folder / "tokenizer_config.json").get("clean_up_tokenization_spaces", False)
    try:
        tokenizer = HFTokenizer(json_text, special, default_prepend_bos, clean_up)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    for key, token in [*_config_special_tokens(folder, tokenizer).items(),
                       *_class_special_tokens(folder, tokenizer).items()]:
        tokenizer.special_tokens.setdefault(key, token)
    return tokenizer


def tokenizer_from_spec(spec: dict[str, Any]) -> Tokenizer | HFTokenizer:
    """The tokenizer a checkpoint's spec describes: ``Tokenizer.to_dict()`` output (no ``kind``, or
    ``kind="vocab"``), or a Hugging Face tokenizer (``kind="hf_tokenizers"``)."""
    kind = spec.get("kind", "vocab")
    if kind == KIND:
        return HFTokenizer.from_dict(spec)
    if kind == "vocab":
        return Tokenizer.from_dict({k: v for k, v in spec.items() if k != "kind"})
    raise ValueError(f"unknown tokenizer kind {kind!r}; known: vocab, {KIND}")
