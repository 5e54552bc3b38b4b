"""The modern families against ``transformers`` (blocklab/weights/hf_llama.py, hf_gpt_neox.py):
Llama, Mistral (sliding window), Qwen2 (q/k/v biases), GPT-NeoX (parallel block, partial rotary) and the
mixtures of experts: Mixtral, Qwen2-MoE (a shared expert), Qwen3-MoE and OLMoE (QK-norm per head, all heads).

For each family, small random models are built with ``transformers`` in several configs (tied and
untied heads, grouped-query ratios, rotary fraction and theta, Llama 3's rope scaling, a window) and
saved with ``save_pretrained``; blocklab loads the folder with its tokenizer. Oracles: the same
``transformers`` model's logits (float32 within 1e-4, float64 within 1e-10), every hidden state and
attention pattern, greedy and sampled generation (the same seed), left-padded batches; export
written back and read by ``transformers`` (the same logits) and by blocklab (bit for bit). No network.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

import blocklab as bl
from blocklab.nn.alibi import alibi_slopes
from blocklab.nn.generate import generate
from blocklab.nn.packed import packed_bytes
from blocklab.weights import read_pretrained, save_pretrained
from blocklab.weights.hf_map import PretrainedError

VOCAB = 101
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
NEO = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=64,
           bos_token_id=1, eos_token_id=2)  # GPT-Neo's names for SHAPE's
BIGCODE = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
               embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)
BLOOM = dict(vocab_size=VOCAB, hidden_size=32, n_layer=2, bos_token_id=1, eos_token_id=2)
FALCON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
LINEAR = {"rope_type": "linear", "factor": 8.0}  # Gemma 3 4B's and up (on the global layers)
LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}

# name -> (transformers class, config); each a different corner of what the import honours
CASES = {
    "llama-mha-untied": (transformers.LlamaForCausalLM, transformers.LlamaConfig(**SHAPE)),
    "llama-gqa-tied-theta": (transformers.LlamaForCausalLM, transformers.LlamaConfig(
        **SHAPE, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=500.0)),
    "llama3-mqa-scaled": (transformers.LlamaForCausalLM, transformers.LlamaConfig(
        **SHAPE, num_key_value_heads=1, rope_theta=50000.0, rope_scaling=LLAMA3)),
    "mistral-window": (transformers.MistralForCausalLM, transformers.MistralConfig(
        **SHAPE, num_key_value_heads=2, sliding_window=5)),
    "qwen2-qkv-bias-tied": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config(
        **SHAPE, num_key_value_heads=2, tie_word_embeddings=True)),
    # Qwen2's sliding layers: those from max_window_layers on (layer 0 full, layer 1 a window of 4)
    "qwen2-max-window-layers-gqa": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config(
        **SHAPE, num_key_value_heads=2, use_sliding_window=True, sliding_window=4, max_window_layers=1)),
    # Qwen3 with layer_types naming each layer's kind (layer 0 a window of 3, layer 1 full)
    "qwen3-layer-types-window-first": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
        **SHAPE, num_key_value_heads=2, head_dim=8, use_sliding_window=True, sliding_window=3,
        layer_types=["sliding_attention", "full_attention"])),
    "qwen3-qk-norm-gqa": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
        **SHAPE, num_key_value_heads=2, head_dim=8, rope_theta=1000.0)),
    # Qwen3-0.6B's shape in small: heads wider than hidden_size / heads (4 x 16 on a width of 32)
    "qwen3-wide-heads-tied": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
        **SHAPE, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)),
    "llama-narrow-heads": (transformers.LlamaForCausalLM, transformers.LlamaConfig(**SHAPE, head_dim=4)),
    "olmo2-res-post-qk-norm-tied": (transformers.Olmo2ForCausalLM, transformers.Olmo2Config(
        **SHAPE, tie_word_embeddings=True)),
    "olmo2-gqa": (transformers.Olmo2ForCausalLM, transformers.Olmo2Config(**SHAPE, num_key_value_heads=1)),
    # Gemma's shape in small: RMSNorm (1 + w), GEGLU (tanh), embeddings x sqrt(d), heads wider than d / h
    "gemma-wide-heads-mqa": (transformers.GemmaForCausalLM, transformers.GemmaConfig(
        **SHAPE, num_key_value_heads=1, head_dim=16)),
    "gemma-exact-gelu-untied": (transformers.GemmaForCausalLM, transformers.GemmaConfig(
        **SHAPE, num_key_value_heads=2, head_dim=8, hidden_act="gelu", tie_word_embeddings=False)),
    # Gemma 2 in small: the sandwich block, soft-capped scores and logits (caps that bend these weights'
    # numbers), the query scalar, sliding layers (windows shorter than the sequences) beside global ones;
    # untied: these small tied models' greedy decoding repeats its last token, which tests nothing
    "gemma2-caps-windows-gqa-untied": (transformers.Gemma2ForCausalLM, transformers.Gemma2Config(
        **SHAPE, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=12, sliding_window=4,
        attn_logit_softcapping=2.0, final_logit_softcapping=5.0, tie_word_embeddings=False,
        attn_implementation="eager")),
    "gemma2-uncapped-wide-heads-untied": (transformers.Gemma2ForCausalLM, transformers.Gemma2Config(
        **SHAPE, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=10, sliding_window=3,
        layer_types=["full_attention", "sliding_attention"], attn_logit_softcapping=None,
        final_logit_softcapping=None, hidden_activation="gelu", tie_word_embeddings=False,
        attn_implementation="eager")),
    # Gemma 3 in small: Gemma 2's block with QK-norm per head (1 + w), no cap on the scores, sliding layers
    # rotating by a base of their own (rope_local_base_freq) far from the global layers' (rope_theta), so that
    # a layer given the other's base fails; the linear rope scaling on the global layers only, as transformers
    "gemma3-local-base-gqa-untied": (transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(
        **SHAPE, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=12, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], rope_theta=10000.0, rope_local_base_freq=10.0,
        final_logit_softcapping=5.0, tie_word_embeddings=False, attn_implementation="eager")),
    "gemma3-global-first-scaled-mqa": (transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(
        **SHAPE, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=10, sliding_window=3,
        layer_types=["full_attention", "sliding_attention"], rope_theta=500.0, rope_scaling=LINEAR,
        hidden_activation="gelu", tie_word_embeddings=False, attn_implementation="eager")),
    "pythia-parallel-quarter": (transformers.GPTNeoXForCausalLM, transformers.GPTNeoXConfig(
        **SHAPE, rotary_pct=0.25, use_parallel_residual=True)),
    "neox-sequential-half": (transformers.GPTNeoXForCausalLM, transformers.GPTNeoXConfig(
        **SHAPE, rotary_pct=0.5, rotary_emb_base=100, use_parallel_residual=False, tie_word_embeddings=True)),
    # Phi (phi-2's shape in small): one shared norm before attention and the FFN side by side, partial
    # rotary in halves, biases everywhere, a biased head
    "phi-shared-norm-partial": (transformers.PhiForCausalLM, transformers.PhiConfig(
        **SHAPE, partial_rotary_factor=0.5, rope_theta=500.0)),
    "phi-gqa-tied-biased-head": (transformers.PhiForCausalLM, transformers.PhiConfig(
        **SHAPE, num_key_value_heads=2, partial_rotary_factor=0.25, tie_word_embeddings=True)),
    # GPT-J: the shared-norm parallel block, adjacent-pair partial rotary, bias-free attention
    "gptj-interleaved-quarter": (transformers.GPTJForCausalLM, transformers.GPTJConfig(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=2, n_inner=48,
        bos_token_id=1, eos_token_id=2)),
    "gptj-full-rotary-tied": (transformers.GPTJForCausalLM, transformers.GPTJConfig(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=8,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)),
    # GPT-Neo: learned positions, unscaled scores, global and local (windowed) layers, bias-free q/k/v
    "neo-global-local-untied": (transformers.GPTNeoForCausalLM, transformers.GPTNeoConfig(
        **NEO, attention_types=[[["global", "local"], 1]], window_size=4, intermediate_size=48,
        tie_word_embeddings=False)),
    "neo-local-first-gelu-tied": (transformers.GPTNeoForCausalLM, transformers.GPTNeoConfig(
        **NEO, attention_types=[[["local", "global"], 1]], window_size=5, activation_function="gelu")),
    # GPT-BigCode (StarCoder): one key/value head in a fused q | k | v, or (multi_query false) a key and value
    # per head interleaved head by head; learned positions, GPT-2's block in nn.Linear layers
    "bigcode-mqa-untied": (transformers.GPTBigCodeForCausalLM, transformers.GPTBigCodeConfig(
        **BIGCODE, n_inner=48, tie_word_embeddings=False)),
    "bigcode-mha-unscaled-gelu-tied": (transformers.GPTBigCodeForCausalLM, transformers.GPTBigCodeConfig(
        **BIGCODE, multi_query=False, scale_attn_weights=False, activation_function="gelu")),
    # StableLM: biased LayerNorms, a bias-free SwiGLU, o without a bias, partial rotary in halves; pre-norm,
    # or the parallel block with one norm (use_parallel_residual), q/k/v biases (use_qkv_bias)
    "stablelm-quarter-gqa-untied": (transformers.StableLmForCausalLM, transformers.StableLmConfig(
        **SHAPE, num_key_value_heads=2, partial_rotary_factor=0.25)),
    "stablelm-parallel-qkv-bias-half-tied": (transformers.StableLmForCausalLM, transformers.StableLmConfig(
        **SHAPE, num_key_value_heads=4, partial_rotary_factor=0.5, use_parallel_residual=True,
        use_qkv_bias=True, rope_theta=500.0, tie_word_embeddings=True)),
    # OLMo 1: Llama's tensors, LayerNorms without parameters (none saved), eps 1e-5
    "olmo-nonparametric-untied": (transformers.OlmoForCausalLM, transformers.OlmoConfig(
        **SHAPE, pad_token_id=0)),
    "olmo-gqa-tied-theta": (transformers.OlmoForCausalLM, transformers.OlmoConfig(
        **SHAPE, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=500.0, pad_token_id=0)),
    # Phi-3: Llama's block with q | k | v fused in qkv_proj and gate | up in gate_up_proj; a window on every
    # layer, or partial rotary (pad_token_id: Phi3Config's default 32000 is past this vocabulary)
    "phi3-window-gqa-untied": (transformers.Phi3ForCausalLM, transformers.Phi3Config(
        **SHAPE, num_key_value_heads=2, sliding_window=5, pad_token_id=0)),
    "phi3-partial-mqa-tied-theta": (transformers.Phi3ForCausalLM, transformers.Phi3Config(
        **SHAPE, num_key_value_heads=1, partial_rotary_factor=0.5, rope_theta=500.0, tie_word_embeddings=True,
        pad_token_id=0)),
    # BLOOM: ALiBi (4 heads; 6: a count that is no power of two), a LayerNorm on the embeddings, q, k, v fused
    # head by head, GELU (tanh), biases everywhere; tied or not
    "bloom-alibi-tied": (transformers.BloomForCausalLM, transformers.BloomConfig(**BLOOM, n_head=4)),
    "bloom-six-heads-untied": (transformers.BloomForCausalLM, transformers.BloomConfig(
        **{**BLOOM, "hidden_size": 48}, n_head=6, tie_word_embeddings=False)),
    # Falcon: falcon-7b's block (the old architecture: one key/value head, attention and MLP side by side
    # after one norm, no linear biases), the new architecture (two norms, key/value groups in query_key_value,
    # biases), and the old sequential block with a key and value per head
    "falcon-old-mqa-parallel-tied": (transformers.FalconForCausalLM, transformers.FalconConfig(**FALCON)),
    "falcon-new-gqa-two-norms-biased-untied": (transformers.FalconForCausalLM, transformers.FalconConfig(
        **FALCON, new_decoder_architecture=True, num_kv_heads=2, bias=True, ffn_hidden_size=48,
        rope_theta=500.0, tie_word_embeddings=False)),
    "falcon-old-mha-sequential-tanh": (transformers.FalconForCausalLM, transformers.FalconConfig(
        **FALCON, multi_query=False, parallel_attn=False, activation="gelu_pytorch_tanh",
        tie_word_embeddings=False)),
    # Mixtral: a mixture of experts in the MLP's place (softmax, top-k, renormalised), Mistral's attention
    "mixtral-top2-gqa-untied": (transformers.MixtralForCausalLM, transformers.MixtralConfig(
        **SHAPE, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    "mixtral-top1-window-tied": (transformers.MixtralForCausalLM, transformers.MixtralConfig(
        **SHAPE, num_key_value_heads=1, num_local_experts=3, num_experts_per_tok=1, sliding_window=5,
        tie_word_embeddings=True)),
    "mixtral-top3-mha": (transformers.MixtralForCausalLM, transformers.MixtralConfig(
        **SHAPE, num_key_value_heads=4, num_local_experts=5, num_experts_per_tok=3, rope_theta=500.0)),
    # Qwen2-MoE: experts of their own width (moe_intermediate_size), a shared expert behind a sigmoid gate,
    # the k weights renormalised only with norm_topk_prob, Qwen2's q/k/v biases
    "qwen2moe-shared-top2-gqa": (transformers.Qwen2MoeForCausalLM, transformers.Qwen2MoeConfig(
        **SHAPE, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
        shared_expert_intermediate_size=40)),
    "qwen2moe-renorm-top3-tied": (transformers.Qwen2MoeForCausalLM, transformers.Qwen2MoeConfig(
        **SHAPE, num_key_value_heads=4, num_experts=6, num_experts_per_tok=3, norm_topk_prob=True,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24, tie_word_embeddings=True, rope_theta=500.0)),
    # Qwen3-MoE: QK-norm per head, heads of their own width
    "qwen3moe-renorm-top2-gqa": (transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig(
        **SHAPE, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=24, norm_topk_prob=True)),
    "qwen3moe-wide-heads-top1-tied": (transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig(
        **SHAPE, num_key_value_heads=1, head_dim=16, num_experts=5, num_experts_per_tok=1,
        moe_intermediate_size=16, tie_word_embeddings=True)),
    # OLMoE: QK-norm over all heads in a pre-norm block, experts of intermediate_size
    "olmoe-top2-mha": (transformers.OlmoeForCausalLM, transformers.OlmoeConfig(
        **SHAPE, num_experts=4, num_experts_per_tok=2)),
    "olmoe-renorm-top3-gqa-tied": (transformers.OlmoeForCausalLM, transformers.OlmoeConfig(
        **SHAPE, num_key_value_heads=2, num_experts=6, num_experts_per_tok=3, norm_topk_prob=True,
        tie_word_embeddings=True)),
}
# each mixture family's config.json name for its number of experts
N_EXPERTS = {"mixtral": "num_local_experts", "qwen2_moe": "num_experts", "qwen3_moe": "num_experts",
             "olmoe": "num_experts"}
SHARED_NORM = ("phi", "gptj")  # model types of the parallel block with one norm
LEARNED = ("gpt_neo", "gpt_bigcode")  # model types with learned positions
# model types whose model an earlier family writes number for number (Phi-3's is Llama's or Mistral's):
# export writes them as themselves when asked
ASKED = ("phi3",)


def _tokenizer_json() -> str:
    """A byte-level BPE over a small vocabulary (the kind of tokenizer.json these families ship),
    adding <s> in front of every text as Llama's post-processor does."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(33, 127):  # printable bytes, in GPT-2's byte-to-unicode form
        vocab.setdefault(chr(b), len(vocab))
    vocab["Ġ"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    assert tok.get_vocab_size() <= VOCAB
    return tok.to_str()


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(name, the transformers model, its folder, blocklab's import of the folder)."""
    name = request.param
    cls, config = CASES[name]
    torch.manual_seed(0)
    hf = cls(config).eval()
    with torch.no_grad():  # spread the weights so that greedy decoding varies
        for p in hf.parameters():
            p.normal_(0.0, 0.3) if p.dim() == 2 else p.add_(0.1 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp(name)
    hf.save_pretrained(str(folder))
    (folder / "tokenizer.json").write_text(_tokenizer_json())
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return name, hf, folder, read_pretrained(folder)


def _ids(seed: int, shape: tuple[int, int] = (2, 11)) -> torch.Tensor:
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def test_the_config_is_read_as_the_family_says(case):
    name, hf, _, loaded = case
    c, h = loaded.model.config, hf.config
    assert c.pos_encoding == ("learned" if h.model_type in LEARNED else
                              "alibi" if h.model_type == "bloom" else "rotary") and c.causal
    assert c.embed_norm == (h.model_type == "bloom")
    kv_heads = getattr(h, "num_key_value_heads", h.num_attention_heads)
    layout = {"olmo2": "res_post", "gemma2": "sandwich", "gemma3_text": "sandwich",
              **{t: "parallel_shared" for t in SHARED_NORM}}.get(h.model_type, "pre")
    if h.model_type == "falcon":  # its own words: num_kv_heads, multi_query, and three blocks
        kv_heads = 1 if h.multi_query and not h.new_decoder_architecture else h.num_kv_heads
        layout = "parallel" if h.new_decoder_architecture else "parallel_shared" if h.parallel_attn else "pre"
    assert c.kv_heads == kv_heads
    assert c.tie_embeddings == h.tie_word_embeddings
    parallel = "parallel_shared" if h.model_type == "stablelm" else "parallel"  # one norm, or two (NeoX)
    assert c.norm_position == (parallel if getattr(h, "use_parallel_residual", False) else layout)
    assert c.head_bias == (h.model_type in SHARED_NORM)
    assert c.qk_norm == {"qwen3": "head", "qwen3_moe": "head", "olmo2": "all_heads", "gemma3_text": "head",
                         "olmoe": "all_heads"}.get(h.model_type, "none")
    local = getattr(h, "rope_local_base_freq", None)  # Gemma 3: the sliding layers' own rotary base
    assert c.local_rotary_base == (local if "sliding_attention" in (getattr(h, "layer_types", None) or [])
                                   else None)
    if h.model_type == "gemma3_text":  # (on the global layers only: ModelConfig.rotary_of)
        assert c.rope_scaling == h.rope_scaling
    kinds = getattr(h, "layer_types", None)  # Qwen2, Qwen3, Gemma 2: each layer sliding or global
    window = getattr(h, "sliding_window", None)
    if h.model_type == "gpt_neo":  # its own words for them, and its own window
        kinds = ["sliding_attention" if k == "local" else "full_attention" for k in h.attention_layers]
        window = h.window_size
    if not kinds:
        assert c.sliding_window == window
    else:
        assert [c.window(i) for i in range(c.n_layers)] == [window if k == "sliding_attention" else None
                                                            for k in kinds]
    assert (c.attn_softcap, c.logit_softcap) == (getattr(h, "attn_logit_softcapping", None),
                                                 getattr(h, "final_logit_softcapping", None))
    unscaled = h.model_type == "gpt_neo" or getattr(h, "scale_attn_weights", True) is False  # scores q k^T
    assert c.query_pre_attn_scalar == (1.0 if unscaled else getattr(h, "query_pre_attn_scalar", None))
    experts = N_EXPERTS.get(h.model_type)
    assert (c.n_experts, c.experts_per_token) == ((getattr(h, experts), h.num_experts_per_tok)
                                                  if experts else (0, 2))
    assert c.renormalize_top_k == getattr(h, "norm_topk_prob", True)
    assert c.shared_expert_d_ff == getattr(h, "shared_expert_intermediate_size", 0)
    if experts:  # each expert's width: moe_intermediate_size where the family has one
        assert c.d_ff == getattr(h, "moe_intermediate_size", h.intermediate_size)
    assert loaded.model_type == h.model_type
    assert bl.count_parameters(c).total == sum(p.numel() for p in hf.parameters())


def test_logits_equal_transformers_float32(case):
    _, hf, _, loaded = case
    tokens = _ids(1, (3, 40))  # past the window and Llama 3's original length
    with torch.no_grad():
        ours, theirs = loaded.model(tokens), hf(tokens).logits
    assert (ours - theirs).abs().max().item() < 1e-4


def _rms_norm_in_the_inputs_dtype(self, hidden_states):
    """transformers' Llama-family RMSNorm, without its cast to float32 (which it makes even in a float64
    model): the formula in the input's dtype, so that a float64 model runs float64 throughout."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _olmo_layer_norm_in_the_inputs_dtype(self, x):
    """transformers' OlmoLayerNorm (no gamma, no beta, eps 1e-5), without its cast to float32."""
    return torch.nn.functional.layer_norm(x, self.normalized_shape, None, None, eps=1e-5)


def _gemma_rms_norm_in_the_inputs_dtype(self, x):
    """transformers' Gemma RMSNorm ((1 + w) x / rms), without its cast to float32."""
    return (1.0 + self.weight) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _gemma2_attention_in_the_inputs_dtype(module, query, key, value, attention_mask, dropout=0.0,
                                          scaling=None, softcap=None, **kwargs):
    """transformers' Gemma 2 eager attention (scaled, soft-capped, masked), its softmax in the input's dtype
    instead of float32."""
    repeat = transformers.models.gemma2.modeling_gemma2.repeat_kv
    key, value = repeat(key, module.num_key_value_groups), repeat(value, module.num_key_value_groups)
    scores = query @ key.transpose(2, 3) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    weights = torch.softmax(scores, dim=-1)
    return (weights @ value).transpose(1, 2).contiguous(), weights


def _gptj_attention_in_the_inputs_dtype(self, query, key, value, attention_mask=None, head_mask=None):
    """transformers' GPT-J attention core (GPTJAttention._attn), without its casts to float32 (of q and k,
    and of its scale sqrt(d_k), rounded to float32 at init)."""
    weights = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.head_dim)
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, : key.shape[-2]]
    weights = torch.softmax(weights, dim=-1).to(value.dtype)
    return torch.matmul(weights, value), weights


def _neo_attention_in_the_inputs_dtype(self, query, key, value, attention_mask=None, head_mask=None):
    """transformers' GPT-Neo attention core (GPTNeoSelfAttention._attn: unscaled, its band masked), without
    its casts of q and k to float32."""
    weights = torch.matmul(query, key.transpose(-1, -2))
    q_len, k_len = query.size(-2), key.size(-2)
    band = self.bias[:, :, k_len - q_len: k_len, :k_len]
    weights = torch.where(band, weights, torch.finfo(weights.dtype).min)
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, :k_len]
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value), weights


def _bloom_alibi_in_float64(attention_mask, num_heads, dtype):
    """transformers' build_alibi_tensor with its slopes in float64 (it computes them in float32): m_h times
    each key's place among the row's real tokens, (B heads, 1, T)."""
    slopes = torch.tensor(alibi_slopes(num_heads), dtype=torch.float64)
    place = ((attention_mask.cumsum(dim=-1) - 1) * attention_mask)[:, None, :].to(torch.float64)
    return (slopes[..., None] * place).reshape(-1, 1, attention_mask.shape[-1]).to(dtype)


def _exact_tanh_gelu(self, x):
    """GELU's tanh form with sqrt(2 / pi) itself (transformers' BloomGelu writes it as 0.79788456)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


class _SoftmaxInTheInputsDtype:
    """torch.nn.functional as BloomAttention calls it, its softmax in the input's dtype (it asks float32)."""

    def __getattr__(self, name):
        return getattr(torch.nn.functional, name)

    @staticmethod
    def softmax(x, dim, dtype=None):
        return torch.softmax(x, dim=dim)


def _mixtral_moe_in_the_inputs_dtype(self, hidden_states):
    """transformers' MixtralSparseMoeBlock.forward with its routing softmax in the inputs' dtype (it asks
    for float32): the same sums, token by token."""
    batch, length, width = hidden_states.shape
    x = hidden_states.view(-1, width)
    router_logits = self.gate(x)
    weights, chosen = torch.topk(torch.softmax(router_logits, dim=1), self.top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where(chosen == e)
        out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
    return out.view(batch, length, width), router_logits


def _routed_moe_in_the_inputs_dtype(self, hidden_states):
    """transformers' Qwen2-MoE, Qwen3-MoE and OLMoE sparse blocks' forward with the routing softmax in the
    inputs' dtype (they ask for float32): the same sums, token by token, the k weights renormalised with
    norm_topk_prob, and Qwen2-MoE's shared expert behind its sigmoid gate."""
    batch, length, width = hidden_states.shape
    x = hidden_states.view(-1, width)
    router_logits = self.gate(x)
    weights, chosen = torch.topk(torch.softmax(router_logits, dim=1), self.top_k, dim=-1)
    if self.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where(chosen == e)
        out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
    if hasattr(self, "shared_expert"):
        out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
    return out.view(batch, length, width), router_logits


def test_logits_equal_transformers_float64(case, monkeypatch):
    """transformers computes the rotary angles in float32 in every model (blocklab too, rotary.py), the
    Llama family's RMSNorm in float32 even in a float64 model, Gemma 3's sqrt(d_model) factor in float32,
    Mixtral's routing softmax, GPT-J's attention scores, BLOOM's ALiBi slopes and attention softmax (and its
    GELU's sqrt(2 / pi) written 0.79788456); with those run in float64 (and GPT-J's logits read before its
    final cast to float32), the two float64 models agree to 1e-10."""
    _, hf, folder, _ = case
    for module in (transformers.models.llama.modeling_llama.LlamaRMSNorm,
                   transformers.models.mistral.modeling_mistral.MistralRMSNorm,
                   transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm,
                   transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm,
                   transformers.models.olmo2.modeling_olmo2.Olmo2RMSNorm,
                   transformers.models.mixtral.modeling_mixtral.MixtralRMSNorm,
                   transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeRMSNorm,
                   transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeRMSNorm,
                   transformers.models.olmoe.modeling_olmoe.OlmoeRMSNorm,
                   transformers.models.phi3.modeling_phi3.Phi3RMSNorm):
        monkeypatch.setattr(module, "forward", _rms_norm_in_the_inputs_dtype)
    for module in (transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock,
                   transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock,
                   transformers.models.olmoe.modeling_olmoe.OlmoeSparseMoeBlock):
        monkeypatch.setattr(module, "forward", _routed_moe_in_the_inputs_dtype)
    monkeypatch.setattr(transformers.models.olmo.modeling_olmo.OlmoLayerNorm, "forward",
                        _olmo_layer_norm_in_the_inputs_dtype)
    monkeypatch.setattr(transformers.models.gemma.modeling_gemma.GemmaRMSNorm, "forward",
                        _gemma_rms_norm_in_the_inputs_dtype)
    gemma2 = transformers.models.gemma2.modeling_gemma2
    monkeypatch.setattr(gemma2.Gemma2RMSNorm, "forward", _gemma_rms_norm_in_the_inputs_dtype)
    monkeypatch.setattr(gemma2, "eager_attention_forward", _gemma2_attention_in_the_inputs_dtype)
    gemma3 = transformers.models.gemma3.modeling_gemma3
    monkeypatch.setattr(gemma3.Gemma3RMSNorm, "forward", _gemma_rms_norm_in_the_inputs_dtype)
    monkeypatch.setattr(gemma3, "eager_attention_forward", _gemma2_attention_in_the_inputs_dtype)
    monkeypatch.setattr(transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock, "forward",
                        _mixtral_moe_in_the_inputs_dtype)
    monkeypatch.setattr(transformers.models.gptj.modeling_gptj.GPTJAttention, "_attn",
                        _gptj_attention_in_the_inputs_dtype)
    monkeypatch.setattr(transformers.models.gpt_neo.modeling_gpt_neo.GPTNeoSelfAttention, "_attn",
                        _neo_attention_in_the_inputs_dtype)
    bloom = transformers.models.bloom.modeling_bloom
    monkeypatch.setattr(bloom, "build_alibi_tensor", _bloom_alibi_in_float64)
    monkeypatch.setattr(bloom.BloomGelu, "forward", _exact_tanh_gelu)
    monkeypatch.setattr(bloom, "F", _SoftmaxInTheInputsDtype())
    model = read_pretrained(folder).model.double()
    hf64 = type(hf)(hf.config).double().eval()
    hf64.load_state_dict(hf.state_dict())
    embed = hf64.get_input_embeddings()
    if hasattr(embed, "embed_scale"):  # Gemma 3's sqrt(d) is a float32 buffer: in float64, as blocklab's
        embed.embed_scale = torch.tensor(hf64.config.hidden_size ** 0.5, dtype=torch.float64)
    tokens = _ids(2, (2, 30))
    with torch.no_grad():
        out = hf64(tokens, output_hidden_states=True)
        # GPT-J's forward casts its logits to float32 at the end: its head on the last hidden state instead
        theirs = out.logits if out.logits.dtype == torch.float64 else hf64.lm_head(out.hidden_states[-1])
        assert (model(tokens) - theirs).abs().max().item() < 1e-10


def test_every_hidden_state_and_attention_pattern_equals_transformers(case):
    _, hf, folder, loaded = case
    eager = type(hf).from_pretrained(str(folder), attn_implementation="eager").eval()
    tokens = _ids(3, (2, 20))
    with torch.no_grad():
        out = eager(tokens, output_hidden_states=True, output_attentions=True)
        _, cache = loaded.model.run_with_cache(tokens)
    assert len(cache.hidden_states) == len(out.hidden_states)
    for ours, theirs in zip(cache.hidden_states, out.hidden_states, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
    for i, theirs in enumerate(out.attentions):
        torch.testing.assert_close(cache[f"blocks.{i}.attn.weights"], theirs, rtol=0, atol=1e-5)
    # the same through forward's transformers-style flags
    mine = loaded.model(tokens, output_hidden_states=True, output_attentions=True)
    torch.testing.assert_close(mine.logits, out.logits, rtol=0, atol=1e-4)
    assert len(mine.hidden_states) == len(out.hidden_states) and len(mine.attentions) == len(out.attentions)
    for ours, theirs in zip(mine.hidden_states + mine.attentions, out.hidden_states + out.attentions,
                            strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
    assert mine.hidden_states[0].requires_grad  # not detached: gradients flow as in transformers


def test_router_logits_and_expert_choices_equal_transformers(case):
    _, hf, _, loaded = case
    if hf.config.model_type not in N_EXPERTS:
        pytest.skip("no experts in this family")
    tokens = _ids(8, (2, 15))
    with torch.no_grad():
        out = hf(tokens, output_router_logits=True)
        _, cache = loaded.model.run_with_cache(tokens)
    k = hf.config.num_experts_per_tok
    for i, theirs in enumerate(out.router_logits):  # (B T, E) per layer
        ours = cache[f"blocks.{i}.ffn.router_logits"]
        torch.testing.assert_close(ours.reshape(theirs.shape), theirs, rtol=0, atol=1e-5)
        weights, chosen = torch.softmax(theirs, dim=-1).topk(k, dim=-1)
        assert torch.equal(cache[f"blocks.{i}.ffn.expert_indices"].reshape(chosen.shape), chosen)
        if getattr(hf.config, "norm_topk_prob", True):  # Mixtral always; the others by norm_topk_prob
            weights = weights / weights.sum(-1, keepdim=True)
        # (the logits' float32 rounding, 1e-5, moves a weight by as much: OLMoE's by 1.3e-6)
        torch.testing.assert_close(cache[f"blocks.{i}.ffn.expert_weights"].reshape(weights.shape),
                                   weights, rtol=0, atol=1e-5)


def _hf_generate(hf, prompt, mask, **settings):
    settings = {"do_sample": False, "eos_token_id": None, "pad_token_id": 0, "top_k": 0, **settings}
    with torch.no_grad():
        return hf.generate(prompt, attention_mask=mask, **settings)


def test_greedy_and_sampled_generation_equal_transformers_on_a_left_padded_batch(case):
    _, hf, _, loaded = case
    lengths = [3, 8, 5]
    width = max(lengths)
    ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = _ids(10 + row, (1, n))[0]
        mask[row, width - n:] = 1
    ours = generate(loaded.model, ids, attention_mask=mask, max_new_tokens=20)
    assert torch.equal(ours, _hf_generate(hf, ids, mask, max_new_tokens=20))
    assert len(set(ours[:, width:].flatten().tolist())) > 5, "the continuation should vary"
    sampled = dict(do_sample=True, top_k=10, top_p=0.9, temperature=1.2)
    ours = generate(loaded.model, ids, attention_mask=mask, max_new_tokens=20, seed=4, **sampled)
    torch.manual_seed(4)  # transformers draws from the global generator
    assert torch.equal(ours, _hf_generate(hf, ids, mask, max_new_tokens=20, **sampled))


def test_one_prompt_generates_transformers_tokens_through_the_packed_decode_weights(case):
    """Batch 1: each one-token step reads the weights packed for it (nn/packed.py: q|k|v and W1|W3
    concatenated, transposed where that streams faster, the head's own copy); greedy and sampled tokens are
    transformers'."""
    _, hf, _, loaded = case
    ids = _ids(7, (1, 6))
    mask = torch.ones_like(ids)
    ours = generate(loaded.model, ids, max_new_tokens=20)
    assert torch.equal(ours, _hf_generate(hf, ids, mask, max_new_tokens=20))
    assert packed_bytes(loaded.model) > 0, "batch 1 decoding should have packed the weights"
    sampled = dict(do_sample=True, top_k=10, top_p=0.9, temperature=1.2)
    ours = generate(loaded.model, ids, max_new_tokens=20, seed=5, **sampled)
    torch.manual_seed(5)
    assert torch.equal(ours, _hf_generate(hf, ids, mask, max_new_tokens=20, **sampled))


def test_the_tokenizer_comes_with_the_model(case):
    _, _, folder, loaded = case
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    assert loaded.tokenizer.encode("a b!") == theirs("a b!")["input_ids"]
    assert loaded.tokenizer.bos_id == 1 and loaded.tokenizer.eos_id == 2


def test_export_loads_in_transformers_and_reads_back_bit_for_bit(case, tmp_path):
    _, hf, folder, loaded = case
    asked = loaded.model_type if loaded.model_type in ASKED else None
    save_pretrained(loaded.model, tmp_path / "out", loaded.tokenizer, family=asked)
    again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert type(again) is type(hf)
    # the same weights through the same code, each loaded from its file: a weight's address changes the
    # last bit of some products (Qwen2-MoE's (1, d) shared_expert_gate gives 1.2e-7 at offset 56 mod 64
    # against 0 at offset 0), so the model transformers built in memory is not the reference
    original = type(hf).from_pretrained(str(folder)).eval()
    tokens = _ids(5)
    with torch.no_grad():
        assert torch.equal(again(tokens).logits, original(tokens).logits)
    back = read_pretrained(tmp_path / "out")
    assert back.model.config == loaded.model.config
    for key, tensor in loaded.model.state_dict().items():
        assert torch.equal(back.model.state_dict()[key], tensor), key


def test_blocklab_load_and_every_model_command_take_the_folder(case, capsys):
    _, hf, folder, _ = case
    loaded = bl.load(folder)
    tokens = _ids(6)
    with torch.no_grad():
        assert torch.equal(loaded.model(tokens), read_pretrained(folder).model(tokens))
    from blocklab.cli import main

    assert main(["generate", "--model", str(folder), "--input", "ab c", "--max-new-tokens", "4"]) == 0
    stage = "q" if hf.config.model_type in LEARNED + ("bloom",) else "rot_q"  # (no rotation)
    stages = ["--stages", f"blocks.0.attn.{stage}"]
    assert main(["trace", "--model", str(folder), "--input", "ab c", *stages]) == 0
    out = capsys.readouterr().out
    assert stage in out


@pytest.mark.parametrize("family, changes, field", [
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ("llama", {"attention_bias": True}, "attention_bias"),
    ("llama", {"mlp_bias": True}, "mlp_bias"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama", {"attention_dropout": 0.1}, "attention_dropout"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1,
               "layer_types": ["full_attention", "chunked_attention"]}, "layer_types"),
    ("qwen2", {"layer_types": ["full_attention", "sliding_attention"]}, "sliding_window=None leaves"),
    ("qwen2", {"use_sliding_window": True, "layer_types": ["sliding_attention"]}, "for each of the 2 layers"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": "1",
               "layer_types": None}, "max_window_layers='1' must be an integer"),
    ("qwen3", {"head_dim": "16"}, "head_dim"),
    ("qwen3", {"attention_bias": True}, "attention_bias"),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 0, "max_window_layers": 1, "layer_types": None},
     r"layer_windows=\(None, 0\)"),
    ("olmo2", {"attention_bias": True}, "attention_bias"),
    ("olmo2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ("gemma", {"hidden_act": "silu"}, "hidden_act"),  # a SwiGLU Gemma: refused, not run as GEGLU
    ("gemma", {"attention_bias": True}, "attention_bias"),
    ("gemma2", {"hidden_activation": "silu"}, "hidden_act"),
    ("gemma2", {"attention_bias": True}, "attention_bias"),
    ("gemma2", {"layer_types": ["full_attention", "chunked_attention"]}, "layer_types"),
    ("gemma2", {"layer_types": ["sliding_attention"]}, "for each of the 2 layers"),
    ("gemma2", {"attn_logit_softcapping": -1.0}, "attn_softcap=-1.0"),
    ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
    ("gemma3_text", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0 is not supported"),
    ("gemma3_text", {"rope_scaling": {"rope_type": "dynamic", "factor": 8.0}}, "rope_scaling"),
    ("gemma3_text", {"layer_types": None, "sliding_window_pattern": 0}, "sliding_window_pattern=0"),
    ("gemma3_text", {"rope_local_base_freq": "1e4"}, "rope_local_base_freq='1e4' must be a finite number"),
    ("gemma3_text", {"attention_dropout": 0.1}, "attention_dropout"),
    ("gemma3_text", {"attention_bias": True}, "attention_bias"),
    ("gemma3_text", {"hidden_activation": "silu"}, "hidden_act"),
    ("gpt_neox", {"attention_bias": False}, "attention_bias"),
    ("gpt_neox", {"hidden_dropout": 0.1}, "hidden_dropout"),
    ("phi", {"qk_layernorm": True}, "qk_layernorm"),
    ("phi", {"resid_pdrop": 0.1}, "resid_pdrop=0.1"),
    ("phi", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ("phi", {"hidden_act": "silu"}, "hidden_act"),
    ("gptj", {"rotary_dim": None}, "rotary_dim=64"),  # absent: transformers' default, wider than a head
    ("gptj", {"rotary_dim": 3}, "rotary_dim=3"),
    ("gptj", {"attn_pdrop": 0.1}, "attn_pdrop=0.1"),
    ("gpt_neo", {"attention_types": [[["global", "sparse"], 1]]}, "attention_types"),
    ("gpt_neo", {"attention_types": [[["global"], 3]]}, "for each of the 2 layers"),
    ("gpt_neo", {"attention_layers": ["local", "local"]}, "attention_layers=.* disagrees"),
    ("gpt_neo", {"resid_dropout": 0.1}, "resid_dropout=0.1"),
    ("gpt_neo", {"activation_function": "swish"}, "activation_function"),
    ("gpt_bigcode", {"add_cross_attention": True}, "add_cross_attention"),
    ("gpt_bigcode", {"attn_pdrop": 0.1}, "attn_pdrop=0.1"),
    ("gpt_bigcode", {"activation_function": "swish"}, "activation_function"),
    ("gpt_bigcode", {"multi_query": "yes"}, "multi_query='yes' must be true or false"),
    ("stablelm", {"qk_layernorm": True}, "qk_layernorm=True"),  # each head its own weights: refused
    ("stablelm", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ("stablelm", {"hidden_dropout": 0.1}, "hidden_dropout=0.1"),
    ("stablelm", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ("phi3", {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}},
     "rope_scaling"),
    ("phi3", {"head_dim": 16}, "head_dim=16"),
    ("phi3", {"resid_pdrop": 0.1}, "resid_pdrop=0.1"),
    ("phi3", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ("bloom", {"apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm"),
    ("bloom", {"pretraining_tp": 2, "slow_but_exact": True}, "slow_but_exact=True"),
    ("bloom", {"hidden_dropout": 0.1}, "hidden_dropout=0.1"),
    ("bloom", {"attention_dropout": 0.1}, "attention_dropout=0.1"),
    ("falcon", {"alibi": True}, "alibi=True"),
    ("falcon", {"new_decoder_architecture": True, "parallel_attn": False}, "parallel_attn=false"),
    ("falcon", {"num_ln_in_parallel_attn": 2}, "num_ln_in_parallel_attn=2"),
    ("falcon", {"multi_query": False, "num_kv_heads": 2}, "num_kv_heads=2"),
    ("falcon", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ("falcon", {"hidden_dropout": 0.1}, "hidden_dropout=0.1"),
    ("falcon", {"activation": "silu"}, "activation='silu'"),
    ("falcon", {"apply_residual_connection_post_layernorm": True},
     "apply_residual_connection_post_layernorm"),
    ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise"),
    ("mixtral", {"num_local_experts": 0}, "num_local_experts=0"),
    ("mixtral", {"num_experts_per_tok": 5}, "experts_per_token=5"),
    ("qwen2_moe", {"decoder_sparse_step": 2}, "decoder_sparse_step=2"),  # layer 0 a dense MLP
    ("qwen2_moe", {"mlp_only_layers": [1]}, r"mlp_only_layers=\[1\] makes layers \[1\] dense"),
    ("qwen2_moe", {"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size=0"),
    ("qwen2_moe", {"num_experts": 0}, "num_experts=0"),
    ("qwen2_moe", {"qkv_bias": False}, "qkv_bias=False"),
    ("qwen2_moe", {"use_sliding_window": True}, "use_sliding_window"),
    ("qwen3_moe", {"mlp_only_layers": [0, 1]}, "mlp_only_layers"),
    ("qwen3_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step=0"),
    ("qwen3_moe", {"attention_bias": True}, "attention_bias"),
    ("qwen3_moe", {"use_sliding_window": True}, "use_sliding_window"),
    ("olmoe", {"clip_qkv": 8.0}, "clip_qkv=8.0"),
    ("olmo", {"clip_qkv": 8.0}, "clip_qkv=8.0 is not supported"),
    ("olmo", {"attention_bias": True}, "attention_bias"),
    ("olmo", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ("olmo", {"hidden_act": "gelu"}, "hidden_act"),
    ("olmoe", {"attention_bias": True}, "attention_bias"),
    ("olmoe", {"num_experts_per_tok": 7}, "experts_per_token=7"),
])
def test_a_config_field_the_import_cannot_honour_is_refused_by_name(tmp_path, family, changes, field):
    cls, config = {"llama": CASES["llama-mha-untied"], "qwen2": CASES["qwen2-qkv-bias-tied"],
                   "qwen3": CASES["qwen3-qk-norm-gqa"], "olmo2": CASES["olmo2-gqa"],
                   "gpt_neox": CASES["pythia-parallel-quarter"], "phi": CASES["phi-shared-norm-partial"],
                   "gptj": CASES["gptj-interleaved-quarter"], "gpt_neo": CASES["neo-global-local-untied"],
                   "gpt_bigcode": CASES["bigcode-mqa-untied"],
                   "stablelm": CASES["stablelm-quarter-gqa-untied"], "phi3": CASES["phi3-window-gqa-untied"],
                   "bloom": CASES["bloom-alibi-tied"], "falcon": CASES["falcon-old-mqa-parallel-tied"],
                   "olmo": CASES["olmo-nonparametric-untied"],
                   "gemma": CASES["gemma-wide-heads-mqa"],
                   "gemma2": CASES["gemma2-caps-windows-gqa-untied"],
                   "gemma3_text": CASES["gemma3-local-base-gqa-untied"],
                   "mixtral": CASES["mixtral-top2-gqa-untied"],
                   "qwen2_moe": CASES["qwen2moe-shared-top2-gqa"],
                   "qwen3_moe": CASES["qwen3moe-renorm-top2-gqa"], "olmoe": CASES["olmoe-top2-mha"]}[family]
    torch.manual_seed(0)
    cls(config).save_pretrained(str(tmp_path))
    written = json.loads((tmp_path / "config.json").read_text())
    changed = {k: v for k, v in {**written, **changes}.items() if v is not None or k not in changes}
    (tmp_path / "config.json").write_text(json.dumps(changed))
    with pytest.raises(PretrainedError, match=field):
        read_pretrained(tmp_path)


def test_gemma2_null_caps_read_as_none_and_sliding_layers_without_a_window_are_refused(tmp_path):
    """In Gemma 2's config.json null is a value: no cap (read as such, not as the default 50 / 30); sliding
    layers with sliding_window null have no window to honour; windows of two sizes have no Gemma 2 layout."""
    cls, config = CASES["gemma2-caps-windows-gqa-untied"]
    torch.manual_seed(0)
    cls(config).save_pretrained(str(tmp_path))
    written = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**written, "attn_logit_softcapping": None,
                                                      "final_logit_softcapping": None}))
    c = read_pretrained(tmp_path).model.config
    assert (c.attn_softcap, c.logit_softcap, c.layer_windows) == (None, None, (4, None))
    (tmp_path / "config.json").write_text(json.dumps({**written, "sliding_window": None}))
    with pytest.raises(PretrainedError, match="sliding_window=None leaves the layers"):
        read_pretrained(tmp_path)
    two = bl.Transformer(c.replace(n_layers=3, layer_windows=(4, None, 5)))
    with pytest.raises(PretrainedError, match=r"Gemma 2 layout: ModelConfig layer_windows=\(4, None, 5\)"):
        save_pretrained(two, tmp_path / "two", family="gemma2")


@pytest.mark.parametrize("pattern", [2, 1, None])  # layer 1 full; every layer full; absent: 6, none full
def test_gemma3_config_json_without_layer_types_slides_by_sliding_window_pattern_as_transformers(tmp_path,
                                                                                                 pattern):
    """A config.json written before layer_types: every sliding_window_pattern-th layer full, as transformers'
    own reading of the same file says; with no sliding layer the local base rotates nothing (unset)."""
    cls, config = CASES["gemma3-local-base-gqa-untied"]
    torch.manual_seed(0)
    cls(config).save_pretrained(str(tmp_path))
    written = json.loads((tmp_path / "config.json").read_text())
    old = {k: v for k, v in written.items() if k != "layer_types"}
    (tmp_path / "config.json").write_text(json.dumps({**old, "sliding_window_pattern": pattern}
                                                     if pattern else old))
    c = read_pretrained(tmp_path).model.config
    kinds = transformers.AutoConfig.from_pretrained(str(tmp_path)).layer_types
    assert [c.window(i) for i in range(2)] == [4 if k == "sliding_attention" else None for k in kinds]
    assert c.local_rotary_base == (10.0 if "sliding_attention" in kinds else None)


def test_gemma3_export_refuses_what_its_config_json_cannot_say(tmp_path):
    """Local layers without a base of their own (rope_local_base_freq would give them one), windows of two
    sizes (one sliding_window) and capped scores (transformers' Gemma 3 never caps them) have no Gemma 3
    layout."""
    from blocklab.weights.hf_folder import export_family

    cls, config = CASES["gemma3-local-base-gqa-untied"]
    torch.manual_seed(0)
    cls(config).save_pretrained(str(tmp_path))
    c = read_pretrained(tmp_path).model.config
    assert export_family(c) is export_family(c, "gemma3_text")
    with pytest.raises(PretrainedError, match=r"gemma3_text layout: ModelConfig local_rotary_base=None "
                                              r"\(read back as 10000.0\)"):
        export_family(c.replace(local_rotary_base=None), "gemma3_text")
    with pytest.raises(PretrainedError, match=r"Gemma 3 layout: ModelConfig layer_windows=\(4, 5\)"):
        export_family(c.replace(layer_windows=(4, 5)), "gemma3_text")
    with pytest.raises(PretrainedError, match=r"Gemma 3 layout: ModelConfig attn_softcap=2.0 \(needs None\)"):
        export_family(c.replace(attn_softcap=2.0), "gemma3_text")
    with pytest.raises(PretrainedError, match=r"gemma2: .*local_rotary_base=10.0 \(needs None\)"):
        export_family(c.replace(qk_norm="none"))  # Gemma 2's block with one rotary base: not this model


@pytest.mark.parametrize("edits, windows", [
    ({"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}, (None, 4)),
    ({"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0}, 4),  # every layer: one window
    ({"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2}, None),
    ({"use_sliding_window": False, "sliding_window": 4, "max_window_layers": 0}, None),  # Qwen2.5's configs
])
def test_qwen2_config_json_without_layer_types_slides_from_max_window_layers_as_transformers(tmp_path, edits,
                                                                                            windows):
    """A config.json written before transformers had layer_types: layer i slides when use_sliding_window and
    i >= max_window_layers; transformers' own reading of the same file says the same."""
    cls, config = CASES["qwen2-qkv-bias-tied"]
    torch.manual_seed(0)
    cls(config).save_pretrained(str(tmp_path))
    written = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in {**written, **edits}.items()
                                                      if k != "layer_types"}))
    c = read_pretrained(tmp_path).model.config
    got = c.layer_windows if c.layer_windows is not None else c.sliding_window
    assert got == windows
    theirs = transformers.AutoConfig.from_pretrained(str(tmp_path))
    assert [c.window(i) for i in range(2)] == [theirs.sliding_window if k == "sliding_attention" else None
                                               for k in theirs.layer_types]


def test_qwen2_export_writes_each_layers_kind_and_refuses_two_window_sizes(tmp_path):
    """Export writes layer_types (read by transformers first) with the one sliding_window; windows of two
    sizes have no Qwen2 layout."""
    from blocklab.weights.hf_folder import export_family

    cls, config = CASES["qwen2-qkv-bias-tied"]
    torch.manual_seed(0)
    cls(config).save_pretrained(str(tmp_path))
    ours = read_pretrained(tmp_path).model.config.replace(n_layers=3, layer_windows=(None, 5, 5))
    out = export_family(ours, "qwen2").hf_config(ours)
    assert (out["use_sliding_window"], out["sliding_window"], out["max_window_layers"]) == (True, 5, 1)
    assert out["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
    for same in (dict(layer_windows=(5, 5, 5)), dict(layer_windows=None, sliding_window=5)):  # either form
        out = export_family(ours.replace(**same), "qwen2").hf_config(ours.replace(**same))
        assert (out["sliding_window"], out["max_window_layers"], set(out["layer_types"])) == (
            5, 0, {"sliding_attention"})
    with pytest.raises(PretrainedError, match=r"Qwen2 layout: ModelConfig layer_windows=\(None, 5, 6\)"):
        export_family(ours.replace(layer_windows=(None, 5, 6)), "qwen2")


def test_gpt_neo_export_writes_the_shortest_repeating_pattern_and_refuses_two_window_sizes():
    """attention_types is written as the shortest pattern of layer kinds that repeats to every layer (and
    attention_layers, transformers' expansion, beside it); GPT-Neo has one window_size."""
    from blocklab.nn.presets import preset
    from blocklab.weights.hf_folder import export_family

    config = preset("gpt-neo-125m", n_layers=4, layer_windows=(None, 256) * 2)
    out = export_family(config, "gpt_neo").hf_config(config)
    assert out["attention_types"] == [[["global", "local"], 2]] and out["window_size"] == 256
    odd = config.replace(layer_windows=(None, None, 8, None))
    assert export_family(odd, "gpt_neo").hf_config(odd)["attention_types"] == [
        [["global", "global", "local", "global"], 1]]
    with pytest.raises(PretrainedError, match=r"GPT-Neo layout: .*layer_windows=\(None, 4, None, 8\)"):
        export_family(config.replace(layer_windows=(None, 4, None, 8)), "gpt_neo")
    with pytest.raises(PretrainedError, match=r"query_pre_attn_scalar=None \(needs 1.0\)"):
        export_family(config.replace(query_pre_attn_scalar=None), "gpt_neo")


def test_gpt_bigcode_export_refuses_grouped_heads_and_other_scales():
    """GPT-BigCode has one key/value head (multi_query) or one per query head, and scores scaled by
    1/sqrt(d_head) or not at all: anything between is refused by name."""
    from blocklab.nn.presets import preset
    from blocklab.weights.hf_folder import export_family

    config = preset("starcoderbase-1b", n_layers=2, vocab_size=64, d_model=64, n_heads=4, d_ff=128)
    assert export_family(config, "gpt_bigcode").hf_config(config)["multi_query"] is True
    mha = config.replace(n_kv_heads=None, query_pre_attn_scalar=1.0)
    out = export_family(mha, "gpt_bigcode").hf_config(mha)
    assert (out["multi_query"], out["scale_attn_weights"]) == (False, False)
    with pytest.raises(PretrainedError, match=r"GPT-BigCode layout: ModelConfig n_kv_heads=2 \(needs 1"):
        export_family(config.replace(n_kv_heads=2), "gpt_bigcode")
    with pytest.raises(PretrainedError, match=r"GPT-BigCode layout: ModelConfig query_pre_attn_scalar=12.0"):
        export_family(config.replace(query_pre_attn_scalar=12.0), "gpt_bigcode")


def test_stablelm_export_refuses_what_its_config_json_cannot_say():
    """StableLM's block is pre-norm or parallel with one norm; its FFN and o have no biases, its norms do."""
    from blocklab.nn.presets import preset
    from blocklab.weights.hf_folder import export_family

    config = preset("stablelm-2-1.6b", n_layers=2, vocab_size=64, d_model=64, n_heads=4, d_ff=96)
    out = export_family(config, "stablelm").hf_config(config)
    assert (out["use_qkv_bias"], out["use_parallel_residual"], out["partial_rotary_factor"]) == (
        True, False, 0.25)
    with pytest.raises(PretrainedError, match=r"StableLM layout: .*norm_position='parallel' \(needs"):
        export_family(config.replace(norm_position="parallel"), "stablelm")
    with pytest.raises(PretrainedError, match=r"StableLM layout: ModelConfig ffn_bias=True \(needs False\)"):
        export_family(config.replace(ffn_bias=True), "stablelm")


def test_alibi_slopes_are_blooms_for_every_head_count_to_its_float32_rounding():
    """transformers' build_alibi_tensor for 1..128 heads: key j's bias is m_h j; its slopes, powers of a
    float32 base taken in float32, are blocklab's to within 8 float32 ulp (5.7 at most; equal outright for 1,
    2, 4, 6 and 8 heads: exact powers of two), and its formula taken in float64 gives them to 1e-14."""
    build = transformers.models.bloom.modeling_bloom.build_alibi_tensor
    for heads in range(1, 129):
        theirs = build(torch.ones(1, 2, dtype=torch.long), heads, torch.float32).reshape(heads, 2)[:, 1]
        ours = torch.tensor(alibi_slopes(heads), dtype=torch.float64)
        torch.testing.assert_close(ours.float(), theirs, rtol=8 * 2.0 ** -23, atol=0, msg=str(heads))
        n = 2 ** math.floor(math.log2(heads))  # the same formula, every step in float64
        exact = [(2 ** (-(2 ** -(math.log2(n) - 3)))) ** k for k in range(1, n + 1)]
        exact += [(2 ** (-(2 ** -(math.log2(2 * n) - 3)))) ** k for k in range(1, 2 * (heads - n), 2)]
        torch.testing.assert_close(ours, torch.tensor(exact, dtype=torch.float64), rtol=1e-14, atol=0)
        if heads in (1, 2, 4, 6, 8):
            assert torch.equal(ours.float(), theirs)


def test_bloom_reads_its_older_names_and_refuses_two_that_disagree(tmp_path):
    """Released BLOOM files say n_embed and num_attention_heads (BloomConfig's other names for hidden_size and
    n_head), and carry no position bound: max_seq_len is seq_length, else 2048; export writes d_ff = 4 d."""
    from blocklab.weights.hf_folder import export_family

    cls, config = CASES["bloom-alibi-tied"]
    torch.manual_seed(0)
    cls(config).save_pretrained(str(tmp_path))
    written = json.loads((tmp_path / "config.json").read_text())
    old = {k: v for k, v in written.items() if k not in ("hidden_size", "n_head", "seq_length")}
    (tmp_path / "config.json").write_text(json.dumps({**old, "n_embed": 32, "num_attention_heads": 4}))
    c = read_pretrained(tmp_path).model.config
    assert (c.d_model, c.n_heads, c.d_ff, c.max_seq_len) == (32, 4, 128, 2048)
    (tmp_path / "config.json").write_text(json.dumps({**written, "n_embed": 64}))
    with pytest.raises(PretrainedError, match="hidden_size=32 disagrees with n_embed=64"):
        read_pretrained(tmp_path)
    with pytest.raises(PretrainedError, match=r"BLOOM layout: ModelConfig d_ff=96 \(needs 128\)"):
        export_family(c.replace(d_ff=96), "bloom")


def test_falcon_export_writes_each_block_and_its_key_value_groups_and_refuses_what_it_cannot_say(tmp_path):
    """The shared-norm block with grouped heads is the new architecture with one norm (num_ln_in_parallel_attn
    1), which transformers builds and computes as blocklab does; biases on some linear layers only, or
    grouped heads in the pre-norm block, have no Falcon layout."""
    from blocklab.nn.presets import preset
    from blocklab.weights.hf_folder import export_family

    config = preset("falcon-7b", n_layers=2, vocab_size=64, d_model=32, n_heads=4, d_ff=64, max_seq_len=32)
    out = export_family(config, "falcon").hf_config(config)
    assert (out["new_decoder_architecture"], out["multi_query"], out["parallel_attn"], out["bias"]) == (
        False, True, True, False)
    grouped = bl.Transformer(config.replace(n_kv_heads=2, qkv_bias=None, o_bias=None, ffn_bias=None))
    save_pretrained(grouped, tmp_path / "grouped", family="falcon")
    written = json.loads((tmp_path / "grouped" / "config.json").read_text())
    assert (written["new_decoder_architecture"], written["num_ln_in_parallel_attn"], written["bias"]) == (
        True, 1, True)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "grouped")).eval()
    tokens = _ids(4, (2, 9)) % 64
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, grouped(tokens), rtol=0, atol=1e-5)
    assert read_pretrained(tmp_path / "grouped").model.config == grouped.config
    with pytest.raises(PretrainedError, match=r"Falcon layout: ModelConfig qkv_bias=None, o_bias=False"):
        export_family(config.replace(qkv_bias=None), "falcon")
    with pytest.raises(PretrainedError, match=r"Falcon layout: ModelConfig n_kv_heads=2 \(the pre-norm"):
        export_family(config.replace(n_kv_heads=2, norm_position="pre"), "falcon")


def test_phi3_fused_rows_are_q_k_v_and_gate_up_and_the_same_model_is_written_as_mistral_unasked(tmp_path):
    """qkv_proj's rows are q (n_heads d_head), k, v (n_kv_heads d_head each), gate_up_proj's gate then up:
    read off transformers' own forward, not off blocklab's map; unasked, export writes the Llama block's
    first family with a window (Mistral), whose transformers model gives the same logits."""
    from blocklab.weights.hf_folder import export_family

    cls, config = CASES["phi3-window-gqa-untied"]
    torch.manual_seed(0)
    hf = cls(config).eval()
    hf.save_pretrained(str(tmp_path / "phi3"))
    loaded = read_pretrained(tmp_path / "phi3")
    layer, block = hf.model.layers[0], loaded.model.blocks[0]
    d_q, d_kv = 4 * 8, 2 * 8
    q, k, v = layer.self_attn.qkv_proj.weight.split([d_q, d_kv, d_kv])
    gate, up = layer.mlp.gate_up_proj.weight.chunk(2)  # Phi3MLP.forward: gate, up = chunk(2)
    for ours, theirs in ((block.attn.q, q), (block.attn.k, k), (block.attn.v, v), (block.ffn.w1, gate),
                         (block.ffn.w3, up)):
        assert torch.equal(ours.weight, theirs)
    assert export_family(loaded.model.config).MODEL_TYPE == "mistral"
    save_pretrained(loaded.model, tmp_path / "mistral")
    again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "mistral")).eval()
    assert type(again) is transformers.MistralForCausalLM
    tokens = _ids(9, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(again(tokens).logits, hf(tokens).logits, rtol=0, atol=1e-5)


def test_qwen_moe_layers_named_dense_past_the_last_are_read_and_a_shared_expert_is_needed_to_export(tmp_path):
    """transformers makes layer i dense only for i < num_hidden_layers in mlp_only_layers: one past the last
    changes nothing and is read; a mixture without a shared expert has no Qwen2-MoE layout."""
    from blocklab.weights.hf_folder import export_family, pretrained_config

    cls, config = CASES["qwen2moe-shared-top2-gqa"]
    torch.manual_seed(0)
    cls(config).save_pretrained(str(tmp_path))
    written = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**written, "mlp_only_layers": [2, 7]}))
    ours = pretrained_config(tmp_path)
    assert ours.n_experts == 4 and ours.shared_expert_d_ff == 40
    with pytest.raises(PretrainedError, match="no Qwen2-MoE layout: ModelConfig shared_expert_d_ff=0"):
        export_family(ours.replace(shared_expert_d_ff=0), "qwen2_moe")


def test_export_chooses_the_family_whose_layout_the_model_has_and_says_why_not(tmp_path):
    model = bl.Transformer(bl.ModelConfig(norm_position="sandwich"))
    with pytest.raises(PretrainedError, match="no Hugging Face layout .*gpt2: .*norm_position='sandwich'"):
        save_pretrained(model, tmp_path / "x")
    llama = bl.Transformer(bl.ModelConfig(norm_position="pre", norm="rms", bias=False, causal=True,
                                          activation="swiglu", pos_encoding="rotary", embed_scale="none",
                                          n_kv_heads=2, d_model=32, n_heads=4))
    save_pretrained(llama, tmp_path / "llama")
    assert json.loads((tmp_path / "llama" / "config.json").read_text())["model_type"] == "llama"
    with pytest.raises(PretrainedError, match="GPT-2 layout: ModelConfig norm='rms'"):
        save_pretrained(llama, tmp_path / "gpt2", family="gpt2")


def test_export_refuses_a_layout_whose_config_json_would_read_back_as_another_model(tmp_path):
    """Every field that changes what the weights compute must survive config.json: grouped heads have no
    place in GPT-2's (its c_attn is three d-wide blocks), QK-norm none in Llama's; a model with QK-norm
    per head is written as Qwen3, over all heads in the res-post-norm block as OLMo 2."""
    gpt2 = bl.preset("gpt2", n_layers=1, vocab_size=50, d_model=32, n_heads=4, max_seq_len=16, n_kv_heads=2)
    with pytest.raises(PretrainedError, match=r"gpt2: .*n_kv_heads=2 \(read back as None\)"):
        save_pretrained(bl.Transformer(gpt2), tmp_path / "gpt2")
    llama = dict(norm="rms", bias=False, causal=True, activation="swiglu", pos_encoding="rotary",
                 embed_scale="none", n_kv_heads=2, d_model=32, n_heads=4)
    with pytest.raises(PretrainedError, match="Llama layout: ModelConfig qk_norm='head'"):
        save_pretrained(bl.Transformer(bl.ModelConfig(**llama, norm_position="pre", qk_norm="head")),
                        tmp_path / "llama", family="llama")
    # one key/value head per query head left unset: config.json's count of them reads back as the same model
    plain = bl.Transformer(bl.ModelConfig(**{**llama, "n_kv_heads": None}, norm_position="pre"))
    save_pretrained(plain, tmp_path / "mha")
    assert json.loads((tmp_path / "mha" / "config.json").read_text())["model_type"] == "llama"
    for qk_norm, position, family in (("head", "pre", "qwen3"), ("all_heads", "res_post", "olmo2")):
        model = bl.Transformer(bl.ModelConfig(**llama, norm_position=position, qk_norm=qk_norm))
        save_pretrained(model, tmp_path / family)
        assert json.loads((tmp_path / family / "config.json").read_text())["model_type"] == family
        again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / family)).eval()
        tokens = _ids(7, (2, 6)) % 18
        with torch.no_grad():
            torch.testing.assert_close(again(tokens).logits, model(tokens), rtol=0, atol=1e-5)
    # OLMo 2's QK-norm in a pre-norm block: no family has it
    with pytest.raises(PretrainedError, match="no Hugging Face layout"):
        save_pretrained(bl.Transformer(bl.ModelConfig(**llama, norm_position="pre", qk_norm="all_heads")),
                        tmp_path / "none")


PRESET_FAMILIES = {"llama-3.2-1b": "llama", "smollm2-135m": "llama", "qwen2.5-0.5b": "qwen2",
                   "pythia-160m": "gpt_neox", "mistral-7b": "mistral", "phi-2": "phi", "gpt-j-6b": "gptj",
                   "mixtral-8x7b": "mixtral", "qwen3-30b-a3b": "qwen3_moe", "olmoe-1b-7b": "olmoe",
                   "qwen1.5-moe-a2.7b": "qwen2_moe", "gemma-2-2b": "gemma2", "gemma-3-1b": "gemma3_text",
                   "gpt-neo-125m": "gpt_neo", "starcoderbase-1b": "gpt_bigcode",
                   "stablelm-2-1.6b": "stablelm", "olmo-1b": "olmo", "phi-3-mini": "phi3",
                   "bloom-560m": "bloom", "falcon-7b": "falcon"}
# a mixture's parts by transformers' module names (the router: block_sparse_moe.gate or mlp.gate)
MOE_PARTS = {"router": r"\.(block_sparse_moe|mlp)\.gate\.", "experts": r"\.experts\.",
             "shared_expert": r"\.shared_expert(_gate)?\."}


@pytest.mark.parametrize("name", list(PRESET_FAMILIES))
def test_each_presets_total_equals_transformers_model_of_its_config_and_the_published_figure(name):
    """The preset's count from the shapes, the transformers model its exported config.json builds (on
    the meta device: no memory), and the released checkpoint's published total agree; a mixture's parts
    (router, experts, shared expert) and its parameters per token are those of transformers' modules."""
    import re

    from blocklab.nn.presets import PUBLISHED_TOTALS, preset
    from blocklab.weights.hf_folder import export_family

    config = preset(name)
    asked = PRESET_FAMILIES[name] if PRESET_FAMILIES[name] in ASKED else None
    family = export_family(config, asked)  # from the config alone: a 7B model is not built to name it
    hf_config = transformers.AutoConfig.for_model(**family.hf_config(config))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    total = sum(p.numel() for p in model.parameters())  # a tied head counted once
    count = bl.count_parameters(config)
    # GPT-J's model card says 6,053,381,344, not its checkpoint's tensors: no published figure to check
    assert count.total == total == PUBLISHED_TOTALS.get(name, total)
    assert hf_config.model_type == PRESET_FAMILIES[name]
    if not config.n_experts:
        return
    named = dict(model.named_parameters())
    for part, pattern in MOE_PARTS.items():
        theirs = sum(p.numel() for key, p in named.items() if re.search(pattern, key))
        assert count.ffn_parts.get(part, 0) * config.n_layers == theirs, part
    one_expert = sum(p.numel() for key, p in named.items() if ".layers.0." in key and ".experts.0." in key)
    idle = (config.n_experts - config.experts_per_token) * one_expert * config.n_layers
    assert count.active == total - idle



# ---- GPT-NeoX's renamed rotary fields: read as transformers 4.x reads them ------------------------


def _pythia_folder(folder, **edits):
    """The small Pythia saved by transformers (both names of each rotary field written), then edited:
    a value None removes the field."""
    cls, config = CASES["pythia-parallel-quarter"]
    torch.manual_seed(0)
    cls(config).save_pretrained(str(folder))
    written = json.loads((folder / "config.json").read_text())
    assert written["rotary_pct"] == written["partial_rotary_factor"] == 0.25
    edited = {k: v for k, v in {**written, **edits}.items() if v is not None}
    (folder / "config.json").write_text(json.dumps(edited))
    return cls.from_pretrained(str(folder)).eval()


@pytest.mark.parametrize("edits", [
    {"partial_rotary_factor": None},  # the older names alone
    {"rotary_pct": None, "rotary_emb_base": None},  # the newer names alone, equal to the defaults
    {"rotary_pct": 0.5, "partial_rotary_factor": 0.5, "rotary_emb_base": 100, "rope_theta": 100.0},
])
def test_neox_rotary_fields_agreeing_import_equal_to_transformers(tmp_path, edits):
    hf = _pythia_folder(tmp_path, **edits)
    loaded = read_pretrained(tmp_path)
    assert loaded.model.config.rotary_fraction == hf.config.rotary_pct
    assert loaded.model.config.rotary_base == hf.config.rotary_emb_base
    tokens = _ids(3)
    with torch.no_grad():
        assert (loaded.model(tokens) - hf(tokens).logits).abs().max().item() < 1e-4


@pytest.mark.parametrize(("edits", "message"), [
    ({"partial_rotary_factor": 1.0}, r"partial_rotary_factor=1.0 disagrees with rotary_pct=0.25"),
    ({"rotary_pct": 0.0}, r"partial_rotary_factor=0.25 disagrees with rotary_pct=0.0"),
    ({"rotary_pct": None, "partial_rotary_factor": 0.5}, r"rotary_pct \(absent: 0.25, the default\)"),
    ({"rope_theta": 500.0}, r"rope_theta=500.0 disagrees with rotary_emb_base=10000"),
])
def test_neox_rotary_fields_that_disagree_are_refused_where_transformers_reads_one(tmp_path, edits, message):
    """transformers reads rotary_pct and rotary_emb_base: with the newer name saying otherwise its model
    differs from what a reader of the newer name builds (1.3e-3 apart in logits for the first case)."""
    hf = _pythia_folder(tmp_path, **edits)
    assert hf.config.partial_rotary_factor == hf.config.rotary_pct  # transformers overwrote the newer name
    with pytest.raises(PretrainedError, match=message):
        read_pretrained(tmp_path)
