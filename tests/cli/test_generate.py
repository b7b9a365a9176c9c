"""``dspark generate``: JSON and text output, the baseline flag, and one-line errors with exit 1."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dspark_trt.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")


def run_cli(capsys, *argv):
    code = main(["generate", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_and_no_draft_baseline(distilled_pair, capsys):
    pair = ["--drafter", distilled_pair.drafter, "--target", distilled_pair.target]
    code, out, _ = run_cli(capsys, *pair, "--input-ids", "1 2 3", "--input-ids", "40,41", "--max-new-tokens", 12,
                           "--json")
    assert code == 0
    spec = json.loads(out)
    assert [len(t) for t in spec["tokens"]] == [12, 12]
    stats = spec["stats"]
    for key in ("mean_acceptance_length", "per_position_acceptance", "rounds", "drafted", "accepted",
                "tokens_per_second", "draft_seconds", "verify_seconds", "other_seconds"):
        assert key in stats
    assert stats["accepted"] <= stats["drafted"] and len(stats["per_position_acceptance"]) == 7
    code, out, _ = run_cli(capsys, *pair, "--input-ids", "1 2 3", "--input-ids", "40,41", "--max-new-tokens", 12,
                           "--json", "--no-draft")
    base = json.loads(out)
    assert code == 0 and base["tokens"] == spec["tokens"] and base["stats"]["accepted"] == 0


def test_batch_size_repeats_prompts_with_consecutive_seeds(distilled_pair, capsys):
    pair = ["--drafter", distilled_pair.drafter, "--target", distilled_pair.target]
    code, out, _ = run_cli(capsys, *pair, "--input-ids", "5 6", "--batch-size", 3, "--temperature", 1,
                           "--seed", 10, "--max-new-tokens", 8, "--topk", "off", "--json")
    assert code == 0
    batch = json.loads(out)["tokens"]
    code, out, _ = run_cli(capsys, *pair, "--input-ids", "5 6", "--temperature", 1, "--seed", 12,
                           "--max-new-tokens", 8, "--topk", "off", "--json")
    assert len(batch) == 3 and json.loads(out)["tokens"][0] == batch[2]  # request 2 = seed 10 + 2


def test_top_p_top_k_and_stop_reach_the_decoder(distilled_pair, capsys):
    from tests.runtime.runtime_helpers import make_decoder

    pair = ["--drafter", distilled_pair.drafter, "--target", distilled_pair.target, "--input-ids", "7 8 9",
            "--max-new-tokens", 16, "--temperature", 1, "--seed", 3, "--json", "--topk", 4]
    code, out, _ = run_cli(capsys, *pair, "--top-p", 0.6, "--top-k", 9)
    assert code == 0
    dec = make_decoder(distilled_pair)
    expected = dec.generate([[7, 8, 9]], 16, temperature=1.0, seed=[3], topk=4, top_p=0.6, top_k=9).tokens
    assert json.loads(out)["tokens"] == expected
    assert expected != dec.generate([[7, 8, 9]], 16, temperature=1.0, seed=[3], topk=4).tokens
    code, out, err = run_cli(capsys, *pair, "--top-p", 0)
    assert code == 1 and "top_p must be in (0, 1]" in err
    code, out, err = run_cli(capsys, *pair, "--stop", "x")
    assert code == 1 and "stop strings need the target's tokenizer" in err


@pytest.mark.slow
def test_stop_cuts_the_text_of_the_default_pair(capsys):
    code, out, err = run_cli(capsys, "--prompt", "The verifier", "--max-new-tokens", 48, "--json")
    assert code == 0, err
    free = json.loads(out)["texts"][0]
    stop = free[10:13]
    code, out, err = run_cli(capsys, "--prompt", "The verifier", "--max-new-tokens", 48, "--json", "--stop", stop,
                             "--stop", "never-seen")
    assert code == 0, err
    assert json.loads(out)["texts"][0] == free[: free.find(stop)]


def test_markov_topm_drafts_with_the_candidate_union_and_stays_lossless(distilled_pair, capsys):
    pair = ["--drafter", distilled_pair.drafter, "--target", distilled_pair.target, "--input-ids", "1 2 3",
            "--max-new-tokens", 12, "--json"]
    code, out, _ = run_cli(capsys, *pair, "--topk", 2, "--markov-topm", 8)
    union = json.loads(out)
    code0, out0, _ = run_cli(capsys, *pair, "--no-draft")
    assert code == code0 == 0 and union["tokens"] == json.loads(out0)["tokens"]
    assert union["stats"]["accepted"] > 0


def test_verify_drafts_auto_is_lossless_and_a_bad_length_is_a_usage_error(distilled_pair, capsys):
    pair = ["--drafter", distilled_pair.drafter, "--target", distilled_pair.target, "--input-ids", "1 2 3",
            "--max-new-tokens", 12, "--json"]
    code, out, _ = run_cli(capsys, *pair, "--verify-drafts", "auto")
    code0, out0, _ = run_cli(capsys, *pair, "--no-draft")
    assert code == code0 == 0 and json.loads(out)["tokens"] == json.loads(out0)["tokens"]
    assert json.loads(out)["stats"]["rounds"] > 0
    with pytest.raises(SystemExit) as exit_info:  # argparse: usage and one error line, exit 2
        run_cli(capsys, *pair, "--verify-drafts", "some")
    assert exit_info.value.code == 2 and "invalid verify_length value: 'some'" in capsys.readouterr().err


CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def with_byte_tokenizer(pair, directory: Path, chat: bool = False) -> Path:
    """A copy of the vocabulary-257 target with the byte tokenizer (ids = bytes), optionally a chat template."""
    from transformers import AutoTokenizer

    from dspark_trt.synthetic.byte_tokenizer import write_byte_tokenizer

    shutil.copytree(pair.target, directory)
    write_byte_tokenizer(directory)  # ids = bytes, 256 = <|mask|>: matches the vocabulary-257 pair
    if chat:
        tok = AutoTokenizer.from_pretrained(directory)
        tok.chat_template = CHAT_TEMPLATE
        tok.save_pretrained(directory)
    return directory


def test_text_prompt_with_a_tokenizer_prints_the_new_text_only(distilled_pair, tmp_path, capsys):
    """A tokenizer without a chat template: the text is fed as it is; plain and JSON outputs both hold the new
    tokens only (no prompt in front: Triton's text_output is the same) and say how the prompt was fed."""
    target = with_byte_tokenizer(distilled_pair, tmp_path / "target")
    args = ["--drafter", distilled_pair.drafter, "--target", target, "--prompt", "hello", "--max-new-tokens", 6]
    code, out, _ = run_cli(capsys, *args)
    lines = out.strip().splitlines()
    assert code == 0 and lines[0] == "prompt format: raw (the text as it is)" and "acceptance" in lines[-1]
    code, js, _ = run_cli(capsys, *args, "--json")
    result = json.loads(js)
    assert code == 0 and result["prompt_format"] == "raw" and lines[1] == f"[0] {result['texts'][0]}"
    from transformers import AutoTokenizer

    decoded = AutoTokenizer.from_pretrained(target).decode(result["tokens"][0], skip_special_tokens=False)
    assert result["texts"][0] == decoded  # the new tokens only: no prompt in front
    code, ids, _ = run_cli(capsys, *args[:4], "--input-ids", " ".join(str(b) for b in b"hello"), *args[6:], "--json")
    assert json.loads(ids)["tokens"] == result["tokens"] and json.loads(ids)["prompt_format"] == "ids"


def test_text_prompt_goes_through_the_chat_template_unless_raw(distilled_pair, tmp_path, capsys):
    target = with_byte_tokenizer(distilled_pair, tmp_path / "target", chat=True)
    args = ["--drafter", distilled_pair.drafter, "--target", target, "--max-new-tokens", 8, "--json"]
    code, out, _ = run_cli(capsys, *args, "--prompt", "hi")
    chat = json.loads(out)
    rendered = " ".join(str(b) for b in b"<user>hi\n<assistant>")  # the template's one user turn, assistant opened
    code_ids, out_ids, _ = run_cli(capsys, *args, "--input-ids", rendered)
    assert code == code_ids == 0 and chat["prompt_format"] == "chat"
    assert chat["tokens"] == json.loads(out_ids)["tokens"]
    code, out, _ = run_cli(capsys, *args, "--prompt", "hi", "--raw")
    raw = json.loads(out)
    code_ids, out_ids, _ = run_cli(capsys, *args, "--input-ids", " ".join(str(b) for b in b"hi"))
    assert code == code_ids == 0 and raw["prompt_format"] == "raw" and raw["tokens"] == json.loads(out_ids)["tokens"]
    code, out, _ = run_cli(capsys, *args[:-1], "--prompt", "hi")
    assert code == 0 and out.splitlines()[0].startswith("prompt format: chat (the tokenizer's chat template")


def mutate_config(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def narrow_drafter(tmp_path_factory):
    """A vocabulary-257 drafter with hidden size 32 (the distilled target has 64)."""
    from dspark_trt.synthetic import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("narrow") / "pair", vocab_size=257, hidden_size=32).drafter


@pytest.mark.parametrize("case, message", [
    ("empty", "prompt 0 is empty"),
    ("big-id", "token id 999 outside the target vocabulary [0, 257)"),
    ("vocab", "drafter vocab_size 257 != target vocab_size 2500"),
    ("hidden", "drafter hidden_size 32 != target hidden_size 64"),
    ("layers", "target_layer_ids [1, 2, 9]"),
    ("mask", "mask_token_id 300 is outside the vocabulary [0, 257)"),
    ("one-model", "pass both --drafter and --target"),
    ("topk", "--topk many: use an integer K >= 1 (candidates per draft slot) or 'off' (the dense Markov head)"),
    ("topm", "--markov-topm must be >= 0 (0 = top-k only), got -1"),
    ("topm-dense", "--markov-topm needs a top-k head"),
    ("verify", "verify_drafts must be an integer in 1 …"),
])
def test_bad_input_is_one_line_and_exit_1(case, message, distilled_pair, random_pair, narrow_drafter, tmp_path,
                                          capsys):
    drafter, target, ids = distilled_pair.drafter, distilled_pair.target, "1 2 3"
    extra = []
    if case == "empty":
        ids = ""
    elif case == "big-id":
        ids = "1 2 999"
    elif case == "vocab":
        target = random_pair.target
    elif case == "hidden":
        drafter = narrow_drafter
    elif case == "layers":
        drafter = mutate_config(Path(drafter), tmp_path / "d", target_layer_ids=[1, 2, 9], num_target_layers=None)
    elif case == "mask":
        drafter = mutate_config(Path(drafter), tmp_path / "d", mask_token_id=300)
    elif case == "topk":
        extra = ["--topk", "many"]
    elif case == "topm":
        extra = ["--topk", "4", "--markov-topm", "-1"]
    elif case == "topm-dense":
        extra = ["--topk", "off", "--markov-topm", "4"]
    elif case == "verify":
        extra = ["--verify-drafts", "0"]
    models = ["--drafter", drafter] if case == "one-model" else ["--drafter", drafter, "--target", target]
    code, out, err = run_cli(capsys, *models, "--input-ids", ids, "--max-new-tokens", 4, *extra)
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert "Traceback" not in err


@pytest.mark.slow
def test_embedded_default_pair_runs_offline(tmp_path, monkeypatch, capsys):
    """No model arguments: the embedded demo pair is built into the cache once and shows acceptance > 1."""
    monkeypatch.setenv("DSPARK_TRT_CACHE", str(tmp_path / "cache"))
    code, out, err = run_cli(capsys, "--prompt", "The verifier", "--max-new-tokens", 48, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["texts"] and len(result["tokens"][0]) == 48
    assert result["stats"]["mean_acceptance_length"] > 1.0
    built = list((tmp_path / "cache" / "demo").glob("embedded-*"))
    assert len(built) == 1 and (built[0] / "target" / "tokenizer.json").is_file()
    code, out2, _ = run_cli(capsys, "--prompt", "The verifier", "--max-new-tokens", 48, "--json")  # cached
    assert code == 0 and json.loads(out2)["tokens"] == result["tokens"]


def test_speculators_drafter_defaults_to_its_recorded_verifier(tiny_causal_pair, capsys):
    """No --target: the verifier directory the speculators config names (here ../target, next to the drafter)."""
    args = ["--drafter", tiny_causal_pair.drafter, "--input-ids", "1 2 3 4 5 6", "--max-new-tokens", 6, "--json"]
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    code, explicit, _ = run_cli(capsys, *args, "--target", tiny_causal_pair.target, "--no-draft")
    assert code == 0 and json.loads(out)["tokens"] == json.loads(explicit)["tokens"]


def test_verbose_prints_the_device_memory_the_runtime_reserves(distilled_pair, capsys):
    """``-v``: one line with what the runtime holds on the device (on this CPU run: nothing)."""
    pair = ["--drafter", distilled_pair.drafter, "--target", distilled_pair.target]
    code, _, err = run_cli(capsys, *pair, "--input-ids", "1 2 3", "--max-new-tokens", 4, "-v")
    lines = [line for line in err.splitlines() if "device memory reserved" in line]
    assert code == 0 and lines == ["[D] device memory reserved: none (the models run on the CPU)"], err[-2000:]
    code, _, err = run_cli(capsys, *pair, "--input-ids", "1 2 3", "--max-new-tokens", 4)
    assert code == 0 and "device memory reserved" not in err  # without -v: not printed
