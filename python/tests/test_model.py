"""nibble.Model against the CLI and the library's own paths: logits, score, perplexity,
generate / stream, chat, errors."""

import json
import struct

import numpy as np
import pytest

import nibble


def read_saved_logits(path):
    """A `perplexity --save_logits` fp32 file (docs/FORMATS.md "Saved logits"): window ids, rows."""
    raw = path.read_bytes()
    assert raw[:8] == b"NIBLOGIT"
    version, vocab, seq_len, n_windows, _text_tokens = struct.unpack_from("<IIQQQ", raw, 8)
    assert version == 1
    offset = 40
    ids = np.frombuffer(raw, dtype="<i4", count=n_windows * seq_len, offset=offset).reshape(n_windows, seq_len)
    offset += ids.nbytes
    rows = np.frombuffer(raw, dtype="<f4", count=n_windows * (seq_len - 1) * vocab, offset=offset)
    return ids, rows.reshape(n_windows, seq_len - 1, vocab)


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_logits_equal_the_cli_perplexity_path(model, model_dir, prose_text, nibble_cli, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(prose_text, encoding="utf-8")
    saved = tmp_path / "logits.bin"
    nibble_cli("perplexity", "--model", model_dir, "--text", text, "--seq_len", 64, "--max_windows", 2,
               "--save_logits", saved)
    ids, rows = read_saved_logits(saved)
    assert ids.shape == (2, 64)
    assert ids[0].tolist() == model.tokenize(prose_text)[:64]
    for w in range(2):
        logits = model.logits(ids[w].tolist())
        assert logits.shape == (64, model.info["vocab_size"]) and logits.dtype == np.float32
        np.testing.assert_array_equal(logits[:-1], rows[w])


def test_score_equals_perplexity_per_token_logprobs(model, prose_text, nibble_cli, model_dir, tmp_path):
    ids = model.tokenize(prose_text)[:64]
    lp = model.score(ids)
    assert lp.shape == (63,)
    # The independent check: log-softmax of the logits, in float64 here.
    ref = log_softmax(model.logits(ids))[np.arange(63), ids[1:]]
    np.testing.assert_allclose(lp, ref, rtol=0, atol=2e-5)
    # perplexity's mean NLL over the same (one) window is the mean of -score.
    text = tmp_path / "text.txt"
    text.write_text(prose_text, encoding="utf-8")
    cli = json.loads(nibble_cli("perplexity", "--model", model_dir, "--text", text, "--seq_len", 64,
                                "--max_windows", 1, "--json").stdout)["perplexity"]
    assert cli["mean_nll"] == pytest.approx(-float(np.mean(lp.astype(np.float64))), abs=1e-5)
    # A text is tokenized with its BOS first.
    np.testing.assert_array_equal(model.score(model.detokenize(ids[1:])), model.score(model.tokenize(model.detokenize(ids[1:]))))


def test_perplexity_equals_the_cli(model, prose_text, nibble_cli, model_dir, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(prose_text, encoding="utf-8")
    # The same thread count as the model fixture: the NLL sums differ in the last bits otherwise.
    cli = json.loads(nibble_cli("perplexity", "--model", model_dir, "--text", text, "--seq_len", 128,
                                "--max_windows", 3, "--threads", 1, "--json").stdout)["perplexity"]
    py = model.perplexity(prose_text, seq_len=128, max_windows=3)
    for key in ("ppl", "ppl_stderr", "mean_nll", "seq_len", "tokens", "windows", "scored_tokens"):
        assert py[key] == cli[key], key


def test_stream_concatenates_to_generate(model):
    for kwargs in ({"temperature": 0.0}, {"temperature": 0.9, "seed": 7}, {"temperature": 0.0, "stop": [" man,"]}):
        text = model.generate("Once upon a time", max_new_tokens=40, **kwargs)
        stream = model.stream("Once upon a time", max_new_tokens=40, **kwargs)
        pieces = list(stream)
        assert "".join(pieces) == text, kwargs
        assert stream.stats["generated_tokens"] >= 1
        if "stop" in kwargs:
            assert " man," not in text and text.endswith(" a")
            assert stream.stats["finish_reason"] == "stop"
    events = list(model.stream("Once upon a time", max_new_tokens=8, temperature=0.0, top_logprobs=3))
    assert "".join(e["text"] for e in events) == model.generate("Once upon a time", max_new_tokens=8, temperature=0.0)
    for e in events:
        if e["id"] >= 0:
            assert e["top_logprobs"][0]["logprob"] >= e["logprob"] - 1e-6  # greedy: the top one
            assert e["logprob"] <= 0


def test_generate_matches_the_cli(model, model_dir, nibble_cli):
    cli = nibble_cli("generate", "--model", model_dir, "--prompt", "Once upon a time", "-n", 24,
                     "--temperature", 0).stdout
    assert cli == "Once upon a time" + model.generate("Once upon a time", max_new_tokens=24, temperature=0) + "\n"


def test_tokenize_and_detokenize(model, model_dir, nibble_cli):
    text = "The quick brown fox, naïvely."
    cli = json.loads(nibble_cli("tokenize", "--model", model_dir, "--text", text).stdout)
    assert model.tokenize(text) == cli
    assert model.tokenize(text, add_special=False) == cli[1:]
    assert model.detokenize(cli) == text


def test_chat_returns_an_openai_completion(model, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}assistant:{% endif %}")
    out = model.chat([{"role": "user", "content": "Tell me a story."}], max_new_tokens=12, temperature=0,
                     chat_template=str(template))
    assert out["object"] == "chat.completion"
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("length", "stop")
    expected = model.generate(model.tokenize("user: Tell me a story.\nassistant:"), max_new_tokens=12, temperature=0)
    assert choice["message"]["content"] == expected
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]
    with pytest.raises(nibble.NotFound, match="chat_template"):
        model.chat([{"role": "user", "content": "hi"}])  # the test model has no template of its own


def test_errors_are_typed_and_name_what_failed(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(nibble.NotFound) as e:
        nibble.Model(str(missing))
    assert str(missing) in str(e.value)
    assert e.value.code == "not_found"
    assert isinstance(e.value, nibble.Error) and isinstance(e.value, FileNotFoundError)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(nibble.CorruptInput, match="config.json"):
        nibble.Model(str(tmp_path / "bad"))
    with pytest.raises(nibble.InvalidArgument, match="activations"):
        nibble.Model(str(missing), activations="fp64")
    assert nibble.InvalidInput is nibble.InvalidArgument


def test_sampling_arguments_are_checked(model):
    with pytest.raises(nibble.InvalidArgument, match="top_p"):
        model.generate("Hi", top_p=1.5)
    with pytest.raises(nibble.InvalidArgument, match="vocabulary|outside"):
        model.generate([1, 10**6], max_new_tokens=2)


def test_presence_and_frequency_penalties(model):
    prompt = "The old man said that the old man"
    plain = model.generate(prompt, max_new_tokens=32, temperature=0)
    assert model.generate(prompt, max_new_tokens=32, temperature=0, presence_penalty=0.0, frequency_penalty=0.0) == plain
    penalised = model.generate(prompt, max_new_tokens=32, temperature=0, frequency_penalty=2.0, presence_penalty=0.5)
    assert penalised != plain
    # Session.next_token counts the same output: the tokens it appended since the prompt.
    g = model.session()
    ids = model.tokenize(prompt)
    g.append_tokens(ids)
    out = [g.next_token(frequency_penalty=2.0, presence_penalty=0.5) for _ in range(32)]
    eos = model.special_tokens["eos_ids"]
    if any(t in eos for t in out):
        out = out[:min(out.index(t) for t in out if t in eos)]
    assert model.detokenize(ids + out) == model.detokenize(ids) + penalised
    with pytest.raises(nibble.InvalidArgument, match="frequency_penalty"):
        model.generate("Hi", frequency_penalty=2.5)


def test_info(model):
    info = model.info
    assert info["architecture"] == "LlamaForCausalLM"
    assert info["vocab_size"] == 4096 and info["weight_format"] == "dense"


def test_import_sets_the_clis_openmp_spin_count(nibble_cli):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    py = subprocess.run([sys.executable, "-c", "import os, nibble; print(os.environ['GOMP_SPINCOUNT'])"],
                        capture_output=True, text=True, env=env, check=True).stdout.strip()
    kernels = json.loads(nibble_cli("inspect", "--kernels", "--json", env=env).stdout)
    assert f"GOMP_SPINCOUNT={py} (nibble's default)" in json.dumps(kernels)


def test_an_error_quoting_bytes_that_are_not_utf8_still_raises(tmp_path):
    import os

    bad = os.fsencode(str(tmp_path)) + b"/model-\xff"  # a path that is not UTF-8 (bytes pass as str)
    with pytest.raises(nibble.NotFound, match="model-\ufffd"):
        nibble.Model(bad)


def test_no_mmap_is_accepted_and_changes_no_logits(model, model_dir):
    ids = model.tokenize("Once upon a time")
    copied = nibble.Model(model_dir, threads=1, no_mmap=True)
    assert np.array_equal(copied.logits(ids), model.logits(ids))
