"""nibble.quantize / convert / verify / inspect against the CLI with the same flags."""

import _thread
import json
import os
import pathlib
import threading

import pytest

import nibble

from conftest import shared_data


def files_of(directory):
    root = pathlib.Path(directory)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_rtn_quantize_is_byte_identical_to_the_cli(model_dir, nibble_cli, tmp_path):
    flags = {"quant_scheme": "w_int4_per_group_sym", "group_size": 64, "model_export": "gptq"}
    nibble_cli("quantize", "--model_dir", model_dir, "--output_dir", tmp_path / "cli",
               *[x for k, v in flags.items() for x in (f"--{k}", v)])
    seen = []
    report = nibble.quantize(model_dir, str(tmp_path / "py"), **flags, threads=1,
                             progress=lambda d, t: seen.append((d, t)))
    assert files_of(tmp_path / "py") == files_of(tmp_path / "cli")
    assert report["quant_algo"] == "rtn"
    assert seen and seen[-1][0] == seen[-1][1]
    with pytest.raises(nibble.InvalidArgument, match="exists|overwrite"):
        nibble.quantize(model_dir, str(tmp_path / "py"))


def test_awq_quantize_is_byte_identical_to_the_cli(model_dir, nibble_cli, tmp_path):
    calib = shared_data("prose-calib.txt")
    nibble_cli("quantize", "--model_dir", model_dir, "--output_dir", tmp_path / "cli", "--quant_algo", "awq",
               "--dataset", calib, "--num_calib_data", 2, "--seq_len", 64, "--n_grid", 5, "--duo_scaling", "false",
               "--threads", 1, "--report", tmp_path / "report.json")
    report = nibble.quantize(model_dir, str(tmp_path / "py"), quant_algo="awq", dataset=str(calib),
                             num_calib_data=2, seq_len=64, threads=1, options={"n_grid": 5, "duo_scaling": False})
    assert files_of(tmp_path / "py") == files_of(tmp_path / "cli")
    cli_report = json.loads((tmp_path / "report.json").read_text())
    assert report.keys() == cli_report.keys()
    assert report["quant_algo"] == cli_report["quant_algo"] == "awq"
    assert report["linears"] == cli_report["linears"]


def test_ctrl_c_during_quantize_leaves_no_output(model_dir, tmp_path):
    calib = shared_data("prose-calib.txt")
    out = tmp_path / "out"
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        nibble.quantize(model_dir, str(out), quant_algo="gptq", dataset=str(calib), num_calib_data=64, seq_len=512)
    timer.join()
    assert not out.exists()
    assert os.listdir(tmp_path) == []  # no staging directory left either


def test_a_progress_callback_that_raises_cancels(model_dir, tmp_path):
    def boom(done, total):
        raise RuntimeError("stop here")

    # GPTQ with calibration runs for seconds: the first call (within 50 ms) raises long before the end.
    calib = shared_data("prose-calib.txt")
    with pytest.raises(RuntimeError, match="stop here"):
        nibble.quantize(model_dir, str(tmp_path / "out"), quant_algo="gptq", dataset=str(calib), num_calib_data=64,
                        seq_len=512, progress=boom)
    assert os.listdir(tmp_path) == []


def test_quant_config_dict_and_unknown_options(model_dir, tmp_path):
    with pytest.raises(nibble.InvalidArgument, match="unknown keyword argument \"grup_size\""):
        nibble.quantize(model_dir, str(tmp_path / "x"), options={"grup_size": 3})
    with pytest.raises(nibble.Error):
        nibble.quantize(model_dir, str(tmp_path / "y"), quant_config={"quant_method": "quark", "global_quant_config": 3})
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_convert_verify_and_inspect(model_dir, nibble_cli, tmp_path):
    nibble.quantize(model_dir, str(tmp_path / "q"), group_size=32)
    summary = nibble.convert(str(tmp_path / "q"), str(tmp_path / "ct"), to="compressed-tensors")
    assert summary["from"] == "quark" and summary["to"] == "compressed-tensors"
    same = nibble.verify(str(tmp_path / "q"), str(tmp_path / "ct"))
    assert same["identical"] and same["b_format"] == "compressed-tensors"
    differs = nibble.verify(model_dir, str(tmp_path / "q"))
    assert not differs["identical"]
    assert any(e["linear"] and not e["identical"] for e in differs["entries"])
    cli = json.loads(nibble_cli("inspect", tmp_path / "ct", "--engines", "--json").stdout)
    assert nibble.inspect(str(tmp_path / "ct")) == cli
    with pytest.raises(nibble.NotFound, match="nothing-here"):
        nibble.inspect(str(tmp_path / "nothing-here"))
    m = nibble.Model(str(tmp_path / "ct"))
    assert m.info["weight_format"] == "compressed-tensors" and m.info["int4_linears"] > 0


def test_the_example_script_runs(model_dir, tmp_path):
    import subprocess
    import sys

    from conftest import SOURCE_DIR

    calib, text = shared_data("prose-calib.txt"), shared_data("prose-val.txt")
    proc = subprocess.run([sys.executable, str(SOURCE_DIR / "python" / "examples" / "quantize_and_eval.py"),
                           "--model", model_dir, "--dataset", str(calib), "--text", str(text), "--out",
                           str(tmp_path / "awq"), "--num_calib_data", "2", "--calib_seq_len", "64", "--seq_len", "128",
                           "--max_windows", "2", "--n_grid", "5", "--threads", "1", "--plot", str(tmp_path / "errors.png")],
                          capture_output=True, text=True, env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    assert "awq   perplexity" in proc.stdout and "relative weight error" in proc.stdout
    assert "log p(continuation | context) = -" in proc.stdout


def test_export_onnx_runs_the_export_program(model_dir, tmp_path):
    nibble.quantize(model_dir, str(tmp_path / "q"), group_size=32)
    nibble.export_onnx(str(tmp_path / "q"), str(tmp_path / "onnx"))
    written = set(os.listdir(tmp_path / "onnx"))
    assert {"model.onnx", "model.onnx.data", "genai_config.json", "tokenizer.model"} <= written
    assert json.loads((tmp_path / "onnx" / "genai_config.json").read_text())["model"]["type"]
    with pytest.raises(nibble.Error, match="dense checkpoint") as e:
        nibble.export_onnx(model_dir, str(tmp_path / "dense-onnx"))
    assert model_dir in str(e.value) and not str(e.value).startswith("nibble:")
    assert not (tmp_path / "dense-onnx").exists()


def test_max_memory_below_the_plan_refuses_before_writing(model_dir, tmp_path):
    report = nibble.quantize(model_dir, str(tmp_path / "ok"), threads=1)
    plan = report["plan"]
    assert plan["peak_anon_bytes"] >= report["memory"]["peak_anon_bytes"] > 0
    assert plan["output_bytes"] > 0 and plan["terms"]
    with pytest.raises(nibble.ResourceExhausted, match="expected peak .* > --max_memory"):
        nibble.quantize(model_dir, str(tmp_path / "refused"), options={"max_memory": "1MB"})
    assert not (tmp_path / "refused").exists()


def test_a_killed_resumable_run_resumes_to_the_same_bytes(model_dir, tmp_path):
    """options resumable / resume: a run SIGKILLed after layer 2 (the library's test hook), then
    resumed from this process, writes what one uninterrupted run writes."""
    import hashlib
    import os
    import signal
    import subprocess
    import sys

    def digests(d):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}

    opts = {"resumable": True, "max_shard_size": "1MB"}
    nibble.quantize(model_dir, str(tmp_path / "full"), options=opts)
    code = ("import nibble, sys; nibble.quantize(sys.argv[1], sys.argv[2], "
            "options={'resumable': True, 'max_shard_size': '1MB'})")
    env = dict(os.environ, NIBBLE_QUANTIZE_KILL_AFTER_LAYER="2")
    r = subprocess.run([sys.executable, "-c", code, model_dir, str(tmp_path / "out")], env=env)
    assert r.returncode == -signal.SIGKILL
    assert not (tmp_path / "out").exists()
    nibble.quantize(model_dir, str(tmp_path / "out"), options=dict(opts, resume=True))
    assert digests(tmp_path / "out") == digests(tmp_path / "full")
