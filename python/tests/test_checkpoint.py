"""nibble.open_checkpoint against the independent reference loader (tests/reference/dequantize.py,
written from the formats specification) for every format nibble writes, act-order g_idx included."""

import importlib.util

import numpy as np
import pytest

import nibble

from conftest import SHARED_DIR, SOURCE_DIR, shared_data


def reference_loader():
    spec = importlib.util.spec_from_file_location("reference_dequantize", SOURCE_DIR / "tests" / "reference" / "dequantize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_linears(ref, directory):
    _config, method, qc = ref.read_config(str(directory))
    loaders = {"quark": ref.quark_load, "compressed-tensors": ref.ct_load, "awq": ref.awq_load, "gptq": ref.gptq_load}
    linears, _used = loaders[method](qc, ref.read_checkpoint(str(directory)))
    return method, linears


def small_model():
    path = SHARED_DIR / "models" / "stories260K"
    if not (path / "config.json").exists():
        pytest.skip(f"needs ../shared/models/stories260K (not found at {path})")
    return str(path)


# AutoAWQ and GPTQ pack 8 outputs per word: gate_proj / up_proj (172 outputs) stay in float there.
NOT_PACKED_BY_8 = ["lm_head", "*mlp.gate_proj", "*mlp.up_proj"]
CASES = [
    ("hf_format", "quark", {}),
    ("compressed-tensors", "compressed-tensors", {"quant_scheme": "w_int4_per_group_sym"}),
    ("awq", "awq", {"exclude_layers": NOT_PACKED_BY_8}),
    ("gptq", "gptq", {"quant_scheme": "w_int4_per_group_sym", "exclude_layers": NOT_PACKED_BY_8}),
]


@pytest.mark.parametrize("export,method,flags", CASES, ids=[c[0] for c in CASES])
def test_dequantize_equals_the_reference_loader(export, method, flags, tmp_path):
    out = tmp_path / export
    # down_proj's in_features (172) is not a multiple of 16: kept in float, so every format holds it.
    nibble.quantize(small_model(), str(out), group_size=16, model_export=export, options={"misaligned": "exclude"},
                    **flags)
    check_against_reference(out, method)


def test_act_order_g_idx_equals_the_reference_loader(tmp_path):
    out = tmp_path / "gptq-actorder"
    nibble.quantize(small_model(), str(out), group_size=16, quant_algo="gptq", model_export="gptq",
                    dataset=str(shared_data("tinyshakespeare.txt")), num_calib_data=4, seq_len=64,
                    exclude_layers=NOT_PACKED_BY_8, options={"misaligned": "exclude", "actorder": "group"})
    ck = check_against_reference(out, "gptq")
    g_idx = [ck.g_idx(l["name"]) for l in ck.linears if l["quantized"]]
    assert any(g is not None and (g != np.arange(len(g)) // 16).any() for g in g_idx)


def as_array(values, dtype):
    if isinstance(values, (bytes, bytearray)):
        return np.frombuffer(values, dtype=np.uint8).astype(dtype)
    return np.array(values, dtype=dtype)


def check_against_reference(out, method):
    ref = reference_loader()
    got_method, linears = reference_linears(ref, out)
    assert got_method == method
    ck = nibble.open_checkpoint(str(out))
    assert ck.format == {"awq": "autoawq"}.get(method, method)
    quantized = [l for l in ck.linears if l["quantized"]]
    assert {l["name"] for l in quantized} == set(linears)
    for l in quantized:
        lin = linears[l["name"]]
        w = ck.dequantize(l["name"])
        assert w.shape == (lin.n, lin.k) and w.dtype == np.float32
        np.testing.assert_array_equal(w, np.frombuffer(lin.dense(), dtype=np.float32).reshape(lin.n, lin.k))
        codes, scales, zeros = ck.codes(l["name"]), ck.scales(l["name"]), ck.zero_points(l["name"])
        np.testing.assert_array_equal(codes.ravel(), as_array(lin.codes, np.uint8))
        np.testing.assert_array_equal(scales.ravel(), as_array(lin.scales, np.float32))
        np.testing.assert_array_equal(zeros.ravel(), as_array(lin.zeros, np.uint8))
        g_idx = ck.g_idx(l["name"])
        groups = g_idx if g_idx is not None else np.arange(lin.k) // ck.quantization(l["name"])["group_size"]
        # The documented formula, from the arrays alone.
        rows = np.arange(lin.n)[:, None]
        formula = (codes.astype(np.float32) - zeros[rows, groups].astype(np.float32)) * scales[rows, groups]
        np.testing.assert_array_equal(w, formula)
    for l in ck.linears:
        if not l["quantized"]:
            with pytest.raises(nibble.InvalidArgument, match="stored in float"):
                ck.codes(l["name"])
            assert ck.dequantize(l["name"]).shape == (l["out_features"], l["in_features"])
    with pytest.raises(nibble.NotFound, match="no_such_linear"):
        ck.dequantize("no_such_linear")
    return ck
