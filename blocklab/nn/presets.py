"""The named presets: the toy models blocklab trains and the published architectures it reproduces
(their shapes, published parameter totals and how each sizes its input embedding).

``preset(name, **overrides)`` is a ``ModelConfig``: a preset is a dict of ModelConfig fields, validated
when it is built.
"""

from __future__ import annotations

from typing import Any

from .config import ModelConfig, changed_from, from_dict


def _gpt(n_layers: int, d_model: int, n_heads: int, n_ctx: int) -> dict[str, Any]:
    """GPT-2/GPT-3 shapes: pre-norm, tanh GELU, learned positions, tied head, causal."""
    return dict(
        vocab_size=50257, max_seq_len=n_ctx, d_model=d_model, n_heads=n_heads, n_layers=n_layers,
        d_ff=4 * d_model, activation="gelu_tanh", norm_position="pre", pos_encoding="learned",
        tie_embeddings=True, causal=True, eps=1e-5,
        embed_scale="none", embed_std=0.02, pos_std=0.01,  # openai/gpt-2 src/model.py: wte 0.02, wpe 0.01
        init="default",  # openai/gpt-2 src/model.py: every weight N(0, 0.02)
    )


# Published architectures. GPT-3 shapes are from Brown et al. 2020, Table 2.1 (n_ctx 2048).
# Two rows of that table are inconsistent (n_heads * d_head != d_model). We keep d_model,
# which fixes the parameter count, and pick a head count that divides it:
#   gpt3-xl:  d_model 2048, listed 24 heads of d_head 128 -> 16 heads of 128.
#   gpt3-13b: d_model 5140, listed 40 heads of d_head 128 -> 20 heads of 257.
# The head count does not change the parameter total (attention is 4 d^2 + 4 d either way).
PRESET_NOTES: dict[str, str] = {
    "gpt3-xl": "paper lists 24 heads of 128 for d_model 2048 (inconsistent); 16 heads of 128 used",
    "gpt3-13b": "paper lists 40 heads of 128 for d_model 5140 (inconsistent); 20 heads of 257 used",
    "bert-base": "published 109,482,240 includes BERT's pooler (768*768 + 768 = 590,592), "
                 "which blocklab does not build",
}

# Published totals, where exact figures exist (GPT-2: the released checkpoints; BERT-base: BertModel; the
# modern families: the released checkpoint's parameter count on its Hugging Face model page; Pythia's also
# Biderman et al. 2023, Table 1).
PUBLISHED_TOTALS: dict[str, int] = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "bert-base": 109_482_240,
    "llama-3.2-1b": 1_235_814_400,
    "smollm2-135m": 134_515_008,
    "qwen2.5-0.5b": 494_032_768,
    "pythia-160m": 162_322_944,
    "phi-2": 2_779_683_840,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "gemma-2-2b": 2_614_341_888,
    "gemma-3-1b": 999_885_952,
}


def _llama(vocab: int, n_ctx: int, d_model: int, d_ff: int, n_layers: int, n_heads: int,
           n_kv_heads: int | None, eps: float, theta: float, **more: Any) -> dict[str, Any]:
    """The Llama block (Llama, SmolLM, Mistral, Qwen2): pre-norm RMSNorm, SwiGLU, rotary positions,
    grouped-query attention, no biases, causal; every weight N(0, 0.02^2) (initializer_range)."""
    return dict(
        vocab_size=vocab, max_seq_len=n_ctx, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
        n_layers=n_layers, d_ff=d_ff, activation="swiglu", norm="rms", norm_position="pre", bias=False,
        causal=True, pos_encoding="rotary", rotary_base=theta, eps=eps, embed_scale="none", embed_std=0.02,
        init="default", **more,
    )

PRESETS: dict[str, dict[str, Any]] = {
    "listops-seed": dict(
        vocab_size=18, max_seq_len=8, d_model=64, n_heads=4, n_layers=2, d_ff=256,
        activation="relu", norm_position="post", embed_scale="sqrt_d_model", embed_std=1.0,
    ),
    "tiny-lm": dict(
        vocab_size=6, max_seq_len=4, d_model=16, n_heads=2, n_layers=2, d_ff=64,
        activation="relu", norm_position="post", causal=True, embed_scale="sqrt_d_model", embed_std=1.0,
    ),
    # A character-level language model of the text task's shipped text (Coriolanus' 60 characters): what
    # trace and explore open when the README's run does not exist (scripts/ship_char_lm.py trains the copy
    # blocklab ships, cli/defaults.py SHIPPED_LM)
    "char-lm": dict(
        vocab_size=60, max_seq_len=64, d_model=64, n_heads=4, n_layers=3, d_ff=256, activation="gelu",
        norm_position="pre", final_norm=True, causal=True, dropout=0.1, embed_scale="sqrt_d_model",
        embed_std=1.0,
    ),
    # The tutorials' worked pipeline (docs/tutorial.md): tiny-lm's vocabulary and sentence, one post-norm
    # block, x0 = E[t] + PE[p] with no factor, long enough for the whole sentence <BOS> ... <EOS>.
    "tutorial": dict(
        vocab_size=6, max_seq_len=5, d_model=16, n_heads=2, n_layers=1, d_ff=64,
        activation="relu", norm_position="post", causal=True, embed_scale="none", embed_std=1.0,
    ),
    "gpt2": _gpt(12, 768, 12, 1024),
    "gpt2-medium": _gpt(24, 1024, 16, 1024),
    "gpt2-large": _gpt(36, 1280, 20, 1024),
    "gpt2-xl": _gpt(48, 1600, 25, 1024),
    "gpt3-small": _gpt(12, 768, 12, 2048),
    "gpt3-medium": _gpt(24, 1024, 16, 2048),
    "gpt3-large": _gpt(24, 1536, 16, 2048),
    "gpt3-xl": _gpt(24, 2048, 16, 2048),
    "gpt3-2.7b": _gpt(32, 2560, 32, 2048),
    "gpt3-6.7b": _gpt(32, 4096, 32, 2048),
    "gpt3-13b": _gpt(40, 5140, 20, 2048),
    "gpt3-175b": _gpt(96, 12288, 96, 2048),
    "bert-base": dict(
        vocab_size=30522, max_seq_len=512, d_model=768, n_heads=12, n_layers=12, d_ff=3072,
        activation="gelu", norm_position="post", eps=1e-12, pos_encoding="learned",
        tie_embeddings=True, type_vocab_size=2, embed_norm=True,
        embed_scale="none", embed_std=0.02, init="default",  # BERT's initializer_range 0.02 everywhere
    ),
    # The modern block at the listops seed's size: what `blocklab train --preset llama-seed` trains.
    "llama-seed": _llama(18, 8, 64, 176, 2, 4, 2, 1e-5, 10000.0),
    # Released models' shapes (their config.json on the Hugging Face hub)
    "llama-3.2-1b": _llama(128256, 131072, 2048, 8192, 16, 32, 8, 1e-5, 500000.0, tie_embeddings=True,
                           rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "smollm2-135m": _llama(49152, 8192, 576, 1536, 30, 9, 3, 1e-5, 100000.0, tie_embeddings=True),
    "qwen2.5-0.5b": _llama(151936, 32768, 896, 4864, 24, 14, 2, 1e-6, 1000000.0, tie_embeddings=True,
                           qkv_bias=True),
    "mistral-7b": _llama(32000, 32768, 4096, 14336, 32, 32, 8, 1e-5, 10000.0, sliding_window=4096),
    # Mixtral's block with a mixture of experts for its FFN: 8 SwiGLU experts of d_ff 14336, each token sent
    # to 2 (softmax over the 8, top-2, renormalised); no window
    "mixtral-8x7b": _llama(32000, 32768, 4096, 14336, 32, 32, 8, 1e-5, 1000000.0, n_experts=8,
                           experts_per_token=2, router_aux_loss_coef=0.02),
    # many small experts: Qwen3-MoE's 128 of d_ff 768, 8 per token, renormalised, QK-norm per head, heads of
    # 128 on a width of 2048; OLMoE's 64 of 1024, 8 per token, not renormalised, QK-norm over all heads;
    # Qwen1.5-MoE's 60 of 1408, 4 per token, not renormalised, and a shared expert of 5632 behind its gate
    "qwen3-30b-a3b": _llama(151936, 40960, 2048, 768, 48, 32, 4, 1e-6, 1000000.0, head_dim=128,
                            qk_norm="head", n_experts=128, experts_per_token=8, router_aux_loss_coef=0.001),
    "olmoe-1b-7b": _llama(50304, 4096, 2048, 1024, 16, 16, None, 1e-5, 10000.0, qk_norm="all_heads",
                          n_experts=64, experts_per_token=8, renormalize_top_k=False),
    "qwen1.5-moe-a2.7b": _llama(151936, 8192, 2048, 1408, 24, 16, None, 1e-6, 1000000.0, qkv_bias=True,
                                n_experts=60, experts_per_token=4, renormalize_top_k=False,
                                shared_expert_d_ff=5632, router_aux_loss_coef=0.001),
    # Gemma 2's sandwich block (a norm on each sublayer's input and output), Gemma's RMSNorm (1 + w), GEGLU
    # (tanh), embeddings times sqrt(d_model), scores and logits soft-capped, scores / sqrt(256), layers 0, 2,
    # ... local (a window of 4096), the others global (transformers' Gemma2Config: Gemma 2 2B)
    "gemma-2-2b": {**_llama(256000, 8192, 2304, 9216, 26, 8, 4, 1e-6, 10000.0, head_dim=256,
                            tie_embeddings=True, attn_softcap=50.0, logit_softcap=30.0,
                            query_pre_attn_scalar=256.0, layer_windows=(4096, None) * 13),
                   "activation": "geglu_tanh", "norm": "rms_plus_one", "norm_position": "sandwich",
                   "embed_scale": "sqrt_d_model"},
    # google/gemma-3-1b-pt's config.json (as remembered, not fetched here): Gemma 2's block with QK-norm per
    # head (Gemma's RMSNorm), no caps, one key/value head, every 6th layer global (rotary base 1e6), the
    # others local (a window of 512, rotary base 1e4: local_rotary_base); 999,885,952 parameters
    "gemma-3-1b": {**_llama(262144, 32768, 1152, 6912, 26, 4, 1, 1e-6, 1000000.0, head_dim=256,
                            tie_embeddings=True, qk_norm="head", query_pre_attn_scalar=256.0,
                            layer_windows=((512,) * 5 + (None,)) * 4 + (512, 512), local_rotary_base=10000.0),
                   "activation": "geglu_tanh", "norm": "rms_plus_one", "norm_position": "sandwich",
                   "embed_scale": "sqrt_d_model"},
    "pythia-160m": dict(
        vocab_size=50304, max_seq_len=2048, d_model=768, n_heads=12, n_layers=12, d_ff=3072,
        activation="gelu", norm_position="parallel", causal=True, pos_encoding="rotary",
        rotary_fraction=0.25, eps=1e-5, embed_scale="none", embed_std=0.02, init="default",
    ),
    # attention and the FFN side by side after one shared norm, partial rotary, a biased head
    "phi-2": dict(
        vocab_size=51200, max_seq_len=2048, d_model=2560, n_heads=32, n_layers=32, d_ff=10240,
        activation="gelu_tanh", norm_position="parallel_shared", causal=True, pos_encoding="rotary",
        rotary_fraction=0.4, eps=1e-5, head_bias=True, embed_scale="none", embed_std=0.02, init="default",
    ),
    # EleutherAI/gpt-neo-125M's config.json: GPT-2's shape with unscaled scores (q k^T, not / sqrt(d_k)),
    # q/k/v without biases, and attention_types [[["global", "local"], 6]]: odd layers local, a window of 256
    "gpt-neo-125m": {**_gpt(12, 768, 12, 2048), "qkv_bias": False, "query_pre_attn_scalar": 1.0,
                     "layer_windows": (None, 256) * 6, "pos_std": None},
    # bigcode/starcoderbase-1b's config.json as published on the Hugging Face Hub (from memory of the file,
    # not fetched here): GPT-2's block with multi-query attention (one key/value head), 8192 positions,
    # d_ff 8192, gelu_pytorch_tanh; 1,137,207,296 parameters (its model card: 1.1B)
    "starcoderbase-1b": {**_gpt(24, 2048, 16, 8192), "vocab_size": 49152, "n_kv_heads": 1, "pos_std": None},
    # stabilityai/stablelm-2-1_6b's config.json (as remembered, not fetched here): LayerNorm with biases, a
    # bias-free SwiGLU, q/k/v biases, o without, rotary on a quarter of each head's 64 features, untied;
    # 1,644,515,328 parameters (its model card: 1.6B)
    "stablelm-2-1.6b": {**_llama(100352, 4096, 2048, 5632, 24, 32, None, 1e-5, 10000.0, qkv_bias=True,
                                 o_bias=False, ffn_bias=False, rotary_fraction=0.25),
                        "norm": "standard", "bias": True},
    # allenai/OLMo-1B-hf's config.json (as remembered, not fetched here): the Llama block with LayerNorms
    # that have no parameters (eps 1e-5), a tied head, no clip_qkv; 1,176,764,416 parameters (model card: 1B)
    "olmo-1b": {**_llama(50304, 2048, 2048, 8192, 16, 16, None, 1e-5, 10000.0, tie_embeddings=True),
                "norm": "nonparametric"},
    # microsoft/Phi-3-mini-4k-instruct's config.json (as remembered, not fetched here): the Llama block (its
    # fused qkv_proj and gate_up_proj hold the same weights), 32 heads of 96, a window of 2047 on every layer,
    # untied; 3,821,079,552 parameters (its model card: 3.8B)
    "phi-3-mini": _llama(32064, 4096, 3072, 8192, 32, 32, None, 1e-5, 10000.0, sliding_window=2047),
    # bigscience/bloom-560m's config.json (as remembered, not fetched here): n_embed 1024, 24 layers, 16
    # heads, ALiBi, a LayerNorm on the embeddings, GELU (tanh), biases everywhere, d_ff 4 d, a tied head over
    # 250,880 tokens; 559,214,592 parameters (its model card: 560M)
    "bloom-560m": dict(
        vocab_size=250880, max_seq_len=2048, d_model=1024, n_heads=16, n_layers=24, d_ff=4096,
        activation="gelu_tanh", norm_position="pre", causal=True, pos_encoding="alibi", embed_norm=True,
        tie_embeddings=True, eps=1e-5, embed_scale="none", embed_std=0.02, init="default",
    ),
    # tiiuae/falcon-7b's config.json (as remembered, not fetched here): the old architecture, attention and
    # the MLP side by side after one LayerNorm, one key/value head (multi_query), 71 heads of 64, no biases on
    # the linear layers, exact GELU, d_ff 4 d, a tied head; 6,921,720,704 parameters (its model card: 7B)
    "falcon-7b": dict(
        vocab_size=65024, max_seq_len=2048, d_model=4544, n_heads=71, n_kv_heads=1, n_layers=32, d_ff=18176,
        activation="gelu", norm_position="parallel_shared", causal=True, pos_encoding="rotary", eps=1e-5,
        qkv_bias=False, o_bias=False, ffn_bias=False, tie_embeddings=True, embed_scale="none", embed_std=0.02,
        init="default",
    ),
    "gpt-j-6b": dict(
        vocab_size=50400, max_seq_len=2048, d_model=4096, n_heads=16, n_layers=28, d_ff=16384,
        activation="gelu_tanh", norm_position="parallel_shared", causal=True, pos_encoding="rotary",
        rotary_fraction=0.25, rotary_style="interleaved", qkv_bias=False, o_bias=False, eps=1e-5,
        head_bias=True, embed_scale="none", embed_std=0.02, init="default",
    ),
}

# The task each toy preset is shaped for (its vocabulary and length): its tokenizer comes with it.
PRESET_TASKS: dict[str, str] = {"listops-seed": "listops", "tiny-lm": "tiny-lm", "tutorial": "tiny-lm",
                                "llama-seed": "listops", "char-lm": "text"}

# How each preset sizes its input embedding (ModelConfig embed_scale, embed_std, pos_std; the
# reasons are in blocklab/nn/embedding.py). `blocklab params --preset NAME` prints the line.
EMBEDDING_CHOICES: dict[str, str] = {
    **{name: "Vaswani et al. 2017 (section 3.4; tensor2tensor's init): tok = sqrt(d_model) E[t], "
             "E ~ N(0, 1/d_model), so token entries start at std 1 beside the sinusoidal code's 1/sqrt(2)"
       for name in ("listops-seed", "tiny-lm", "char-lm")},
    "tutorial": "the tutorials' worked pipeline: x0 = E[t] + PE[p], no factor, E ~ N(0, 1) (the weights a "
                "learner gives with --weights replace it)",
    **{name: "GPT-2's released code (openai/gpt-2 src/model.py): x0 = wte[t] + wpe[p], no factor, "
             "wte ~ N(0, 0.02^2), wpe ~ N(0, 0.01^2)"
       for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")},
    **{name: "as GPT-2 (Brown et al. 2020 use GPT-2's model): no factor, token table N(0, 0.02^2), "
             "positions N(0, 0.01^2)"
       for name in ("gpt3-small", "gpt3-medium", "gpt3-large", "gpt3-xl", "gpt3-2.7b", "gpt3-6.7b",
                    "gpt3-13b", "gpt3-175b")},
    "bert-base": "BERT's layout: x0 = LayerNorm(word + position + token type), no factor, every table "
                 "N(0, 0.02^2) (BERT's code: a truncated normal of std 0.02)",
    **{name: "the Llama layout (transformers' initializer_range): x0 = E[t], no factor, E ~ N(0, 0.02^2); "
             "positions are rotary, inside attention, so x0 has no position part"
       for name in ("llama-seed", "llama-3.2-1b", "smollm2-135m", "qwen2.5-0.5b", "mistral-7b",
                    "mixtral-8x7b", "qwen3-30b-a3b", "olmoe-1b-7b", "qwen1.5-moe-a2.7b", "olmo-1b",
                    "phi-3-mini")},
    **{name: "Gemma's layout: x0 = sqrt(d_model) E[t] (the factor rounded to the model's dtype), the "
             "token part at std 0.02 at init (embed_std); rotary positions, inside attention"
       for name in ("gemma-2-2b", "gemma-3-1b")},
    "pythia-160m": "GPT-NeoX's layout: x0 = E[t], no factor, E ~ N(0, 0.02^2); rotary positions on 25% of "
                   "each head, inside attention",
    "phi-2": "Phi's layout: x0 = E[t], no factor, E ~ N(0, 0.02^2); rotary positions on 40% of each head, "
             "inside attention",
    "gpt-neo-125m": "GPT-2's (transformers' GPT-Neo initializer_range): x0 = wte[t] + wpe[p], no factor, "
                    "both tables N(0, 0.02^2)",
    "starcoderbase-1b": "GPT-2's (transformers' GPT-BigCode initializer_range): x0 = wte[t] + wpe[p], no "
                        "factor, both tables N(0, 0.02^2)",
    "stablelm-2-1.6b": "the Llama layout (transformers' initializer_range): x0 = E[t], no factor, E ~ N(0, "
                       "0.02^2); rotary positions on 25% of each head, inside attention",
    "bloom-560m": "BLOOM's layout: x0 = LayerNorm(E[t]), no factor, E ~ N(0, 0.02^2); no position code "
                  "in x0: ALiBi's linear penalty on the scores, inside attention",
    "falcon-7b": "Falcon's layout: x0 = E[t], no factor, E ~ N(0, 0.02^2); rotary positions on every "
                 "feature of each head, inside attention",
    "gpt-j-6b": "GPT-J's layout: x0 = E[t], no factor, E ~ N(0, 0.02^2); rotary positions on 64 of each "
                "head's 256 features (adjacent pairs), inside attention",
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The named preset's config, with any fields overridden."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets are: {', '.join(PRESETS)}")
    return from_dict(changed_from(PRESETS[name], overrides))
