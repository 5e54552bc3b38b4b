"""The `blocklab params` command, in process and as the installed console script."""

import json
import subprocess
import sys

from blocklab.cli import main


def test_params_json_for_gpt2(capsys) -> None:
    assert main(["params", "--preset", "gpt2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total"] == 124_439_808
    assert sum(out["components"].values()) == out["total"]


def test_params_table_shows_components_and_published_total(capsys) -> None:
    assert main(["params", "--preset", "gpt2"]) == 0
    out = capsys.readouterr().out
    assert "124,439,808" in out and "blocks.ffn" in out and "published total: 124,439,808 (equal)" in out


def test_params_custom_shape_flags(capsys) -> None:
    assert main(["params", "--d-model", "128", "--n_heads", "8", "--d-ff", "4x", "--activation", "swiglu",
                 "--bias", "false", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["per_layer"]["ffn"] == 3 * 128 * 512
    assert out["per_layer"]["attn"] == 4 * 128 * 128


def test_params_of_a_mixture_show_its_parts_inside_the_ffn_row_and_the_active_count(capsys) -> None:
    """Mixtral 8x7B (published 46,702,792,704 of which 12,879,925,248 per token, top-2 of 8): the parts
    are sub-rows of blocks.ffn, which holds the whole mixture (the components still sum to the total)."""
    assert main(["params", "--preset", "mixtral-8x7b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sum(out["components"].values()) == out["total"] == 46_702_792_704
    assert out["active"] == 12_879_925_248
    assert out["ffn_parts"] == {"router": 8 * 4096, "experts": 8 * 3 * 4096 * 14336}
    assert out["components"]["blocks.ffn"] == 32 * sum(out["ffn_parts"].values())
    assert main(["params", "--preset", "mixtral-8x7b"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ffn = next(i for i, line in enumerate(lines) if "blocks.ffn" in line)
    rows = [line.split("│")[1].strip() for line in lines[ffn + 1:] if line.startswith("│")]
    assert rows[:3] == ["router", "experts", "blocks.ln1"]
    assert "active per token: 12,879,925,248 (27.6%: 2 of 8 experts in each block)" in lines


def test_invalid_config_is_one_line_and_exit_2(capsys) -> None:
    assert main(["params", "--n-heads", "3"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("blocklab: error: ModelConfig.n_heads=3 must divide d_model=64 "
                           "(or set head_dim: each head's width)")


def test_console_script_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "blocklab", "params", "--preset", "gpt2", "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["total"] == 124_439_808


def test_params_say_how_the_scores_and_logits_are_scaled_and_capped(capsys) -> None:
    assert main(["params", "--causal", "true", "--attn-softcap", "50", "--logit-softcap", "30",
                 "--query-pre-attn-scalar", "256"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "attention scores: Q K^T / sqrt(256) (query_pre_attn_scalar), not / sqrt(d_head 16)" in out
    assert "attention scores soft-capped: 50 tanh(s / 50)" in out
    assert "logits soft-capped: 30 tanh(logits / 30)" in out
    assert main(["params"]) == 0
    assert "soft-capped" not in capsys.readouterr().out
