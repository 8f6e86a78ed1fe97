#!/usr/bin/env python3
"""Reference loader: a quantized int4 checkpoint directory -> a dense fp32 checkpoint directory.

Written from the formats specification (docs/SPEC.md in the shared tree: §1.4-1.6 Quark
hf_format, §2.2 compressed-tensors pack-quantized, §2.3 AutoAWQ GEMM, §3.2 GPTQ, §9 and
Appendix A), independently of nibble's own readers, so that the two can be checked against each
other. Standard library only.

    dequantize.py QUANTIZED_DIR OUTPUT_DIR
    dequantize.py --self-test      (the specification's test vectors)

Every quantized linear P becomes P.weight (F32, [out, in]) with w = (q - z) * s; every other
tensor is copied as stored; config.json loses quantization_config; tokenizer and generation
files are copied. Anything the specification does not describe is an error naming it.
"""

import array
import fnmatch
import json
import os
import re
import shutil
import struct
import sys


class FormatError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# safetensors

_DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U8": 1, "BOOL": 1}


class Tensor:
    def __init__(self, name, dtype, shape, data, path):
        self.name, self.dtype, self.shape, self.data, self.path = name, dtype, shape, data, path

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


def _le_array(code, data):
    a = array.array(code)
    a.frombytes(data)
    if sys.byteorder != "little":
        a.byteswap()
    return a


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise FormatError("%s: too short for a safetensors header" % path)
    (hlen,) = struct.unpack("<Q", raw[:8])
    if 8 + hlen > len(raw):
        raise FormatError("%s: header length %d exceeds the file size %d" % (path, hlen, len(raw)))
    try:
        header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError("%s: header is not valid JSON: %s" % (path, e))
    base = 8 + hlen
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _DTYPE_SIZE:
            raise FormatError("%s: tensor %s has dtype %s, not one this loader reads" % (path, name, dtype))
        t = Tensor(name, dtype, list(shape), raw[base + begin:base + end], path)
        if end < begin or base + end > len(raw) or t.numel() * _DTYPE_SIZE[dtype] != end - begin:
            raise FormatError("%s: tensor %s: data offsets [%d, %d) do not hold shape %s of %s"
                              % (path, name, begin, end, shape, dtype))
        tensors[name] = t
    return tensors


def read_checkpoint(d):
    index = os.path.join(d, "model.safetensors.index.json")
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise FormatError("%s: no weight_map object" % index)
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            for name, t in read_safetensors(os.path.join(d, shard)).items():
                if weight_map.get(name) != shard:
                    raise FormatError("%s: tensor %s is in %s but the index places it in %s"
                                      % (index, name, shard, weight_map.get(name)))
                tensors[name] = t
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise FormatError("%s: tensors listed but not stored: %s" % (index, ", ".join(missing[:5])))
        return tensors
    if os.path.exists(single):
        return read_safetensors(single)
    raise FormatError("%s: neither model.safetensors nor model.safetensors.index.json" % d)


def write_safetensors(path, entries):
    """entries: name -> (dtype, shape, bytes). Tensors in name order, header padded to 8 bytes."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(entries):
        dtype, shape, data = entries[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------------------------------------
# tensor values

def floats(t):
    """A float tensor's values as Python floats (exact: fp16 / bf16 / fp32 all fit a double)."""
    if t.dtype == "F32":
        return _le_array("f", t.data)
    if t.dtype == "F16":
        return struct.unpack("<%de" % t.numel(), t.data)
    if t.dtype == "BF16":
        wide = bytearray(2 * len(t.data))  # bf16 is the upper half of an fp32
        wide[2::4] = t.data[0::2]
        wide[3::4] = t.data[1::2]
        return _le_array("f", bytes(wide))
    raise FormatError("%s: tensor %s: dtype %s, expected F16, BF16 or F32" % (t.path, t.name, t.dtype))


def ints(t):
    if t.dtype == "I32":
        return _le_array("i", t.data)
    if t.dtype == "I64":
        return _le_array("q", t.data)
    raise FormatError("%s: tensor %s: dtype %s, expected I32 or I64" % (t.path, t.name, t.dtype))


def check_shape(t, want, what=""):
    if t.shape != want:
        raise FormatError("%s: tensor %s: shape %s, expected %s%s" % (t.path, t.name, t.shape, want, what))


def check_scales(t, values):
    for i, s in enumerate(values):
        if not (s >= 0.0 and s != float("inf")):
            raise FormatError("%s: tensor %s: element %d is %r, expected a finite scale >= 0"
                              % (t.path, t.name, i, s))


_LO = bytes(i & 0xF for i in range(256))
_HI = bytes(i >> 4 for i in range(256))
_XOR8 = bytes(i ^ 8 for i in range(256))
_REORDER_INV = (0, 4, 1, 5, 2, 6, 3, 7)  # logical j of a word sits in nibble _REORDER_INV[j]


def nibbles(t):
    """An int32 tensor's nibbles, word by word, nibble 0 (bits 0-3) first: one byte each."""
    if t.dtype != "I32":
        raise FormatError("%s: tensor %s: dtype %s, expected I32 (packed int4)" % (t.path, t.name, t.dtype))
    out = bytearray(2 * len(t.data))  # little-endian: byte b holds nibbles 2b (low) and 2b+1
    out[0::2] = t.data.translate(_LO)
    out[1::2] = t.data.translate(_HI)
    return bytes(out)


def unreorder(nib):
    """AWQ / Quark 'reorder' words to logical order within each run of 8."""
    out = bytearray(len(nib))
    for j, i in enumerate(_REORDER_INV):
        out[j::8] = nib[i::8]
    return bytes(out)


def cut_columns(a, rows, stored, cols):
    """[rows, stored] -> [rows, cols]: drops the padding nibbles at the end of each row."""
    if stored == cols:
        return a
    return b"".join(a[r * stored:r * stored + cols] for r in range(rows))


def transpose(a, rows, cols):
    """[rows, cols] byte matrix -> [cols, rows]."""
    return b"".join(a[c::cols] for c in range(cols))


# ---------------------------------------------------------------------------------------------
# the one dequantization every format reduces to (Appendix A)

class Int4Linear:
    """codes [n, k] unsigned 0..15 (bytes), zeros and scales [n, groups], g_idx [k] or None
    (column c in group c // group_size)."""

    def __init__(self, n, k, group_size, codes, zeros, scales, g_idx=None):
        self.n, self.k, self.group_size = n, k, group_size
        self.codes, self.zeros, self.scales, self.g_idx = codes, zeros, scales, g_idx

    def dense(self):
        n, k, g = self.n, self.k, self.group_size
        groups = len(self.scales) // n
        out = array.array("f")
        if self.g_idx is None:
            for r in range(n):
                for gi in range(groups):
                    z, s = self.zeros[r * groups + gi], self.scales[r * groups + gi]
                    table = [(c - z) * s for c in range(16)]
                    lo = r * k + gi * g
                    out.extend(map(table.__getitem__, self.codes[lo:min(lo + g, r * k + k)]))
        else:
            for r in range(n):
                tables = [[(c - self.zeros[r * groups + gi]) * self.scales[r * groups + gi] for c in range(16)]
                          for gi in range(groups)]
                row = self.codes[r * k:(r + 1) * k]
                out.extend([tables[gi][c] for gi, c in zip(self.g_idx, row)])
        if sys.byteorder != "little":
            out.byteswap()
        return out.tobytes()


def to_rows(values, groups, n):
    """[groups, n] (Quark / AutoAWQ / GPTQ scale layout) -> [n, groups] flat list."""
    return [values[gi * n + r] for r in range(n) for gi in range(groups)]


def check_g_idx(t, values, k, groups, required_natural, g):
    if len(values) != k:
        raise FormatError("%s: tensor %s: %d entries, expected %d (in_features)" % (t.path, t.name, len(values), k))
    for c, gi in enumerate(values):
        if not 0 <= gi < groups:
            raise FormatError("%s: tensor %s: entry %d is %d, expected 0..%d" % (t.path, t.name, c, gi, groups - 1))
    natural = all(gi == c // g for c, gi in enumerate(values))
    if required_natural and not natural:
        raise FormatError("%s: tensor %s is not the natural order c // %d, but the config declares no act-order"
                          % (t.path, t.name, g))
    return None if natural else list(values)


# ---------------------------------------------------------------------------------------------
# which modules are linears, and which of them the file quantizes

def module_names(tensors, suffixes):
    mods = set()
    for name in tensors:
        for suf in suffixes:
            if name.endswith("." + suf):
                mods.add(name[:-len(suf) - 1])
    return mods


def linear_candidates(tensors, quant_suffixes):
    """Module prefixes that are linears: 2-D weights except embeddings, plus every module holding a
    quantized tensor."""
    mods = module_names(tensors, quant_suffixes)
    for name, t in tensors.items():
        if name.endswith(".weight") and len(t.shape) == 2 and not name.endswith("embed_tokens.weight"):
            mods.add(name[:-len(".weight")])
    return sorted(mods)


def check_agreement(prefix, stored_quantized, config_quantized, rule):
    if stored_quantized and not config_quantized:
        raise FormatError("module %s stores quantized tensors but the config keeps it in float (%s)" % (prefix, rule))
    if config_quantized and not stored_quantized:
        raise FormatError("module %s: the config quantizes it (%s) but its weight is stored in float" % (prefix, rule))


def take(tensors, used, name, prefix):
    if name not in tensors:
        have = sorted(n[len(prefix) + 1:] for n in tensors if n.startswith(prefix + "."))
        raise FormatError("module %s: tensor %s is missing (the module stores: %s)" % (prefix, name, ", ".join(have)))
    used.add(name)
    return tensors[name]


def check_known_tensors(tensors, used, prefix, allowed):
    for name in tensors:
        if name.startswith(prefix + ".") and name not in used and name[len(prefix) + 1:] not in allowed:
            raise FormatError("module %s: tensor %s is not part of this format's quantized linear" % (prefix, name))


def want(cond, key, found, expected):
    if not cond:
        raise FormatError("quantization_config: %s is %s, expected %s" % (key, json.dumps(found), expected))


# ---------------------------------------------------------------------------------------------
# AMD Quark hf_format (SPEC §1.2-1.6)

def quark_resolve(qc, name):
    """The weight spec of module `name` (None: float) and the rule that decided (SPEC §1.3)."""
    for pat in qc.get("exclude") or []:
        hit = re.match(pat[3:], name) if pat.startswith("re:") else fnmatch.fnmatchcase(name, pat)
        if hit:
            return None, "exclude %r" % pat
    for key, cfg in (qc.get("layer_quant_config") or {}).items():
        if fnmatch.fnmatchcase(name, key):
            return cfg.get("weight"), "layer_quant_config %r" % key
    types = qc.get("layer_type_quant_config") or {}
    for key in types:
        want(key in ("Linear", "Conv2d"), "layer_type_quant_config key", key, "Linear")
    if "Linear" in types:
        return types["Linear"].get("weight"), "layer_type_quant_config Linear"
    return (qc.get("global_quant_config") or {}).get("weight"), "global_quant_config"


def quark_check_layer_config(cfg_name, cfg):
    for key in ("input_tensors", "output_tensors", "bias"):
        want(cfg.get(key) is None, "%s.%s" % (cfg_name, key), cfg.get(key), "null (weight-only int4)")


def quark_check_spec(spec, rule):
    if isinstance(spec, list):
        raise FormatError("%s: a list of weight specs (multi-stage quantization) is not int4 per-group" % rule)
    want(spec.get("dtype") in ("int4", "uint4"), rule + " weight.dtype", spec.get("dtype"), '"int4" or "uint4"')
    want(spec.get("qscheme") == "per_group", rule + " weight.qscheme", spec.get("qscheme"), '"per_group"')
    want(not spec.get("is_dynamic"), rule + " weight.is_dynamic", spec.get("is_dynamic"), "false")
    want(spec.get("ch_axis", 1) == 1, rule + " weight.ch_axis", spec.get("ch_axis"), "1")
    g = spec.get("group_size")
    want(isinstance(g, int) and (g > 0 or g == -1), rule + " weight.group_size", g, "a positive int or -1")


def quark_unpack(t, rows, cols, reorder):
    """A packed [rows, ceil(cols/8)] tensor -> [rows, cols] nibbles in logical order."""
    words = (cols + 7) // 8
    check_shape(t, [rows, words])
    nib = nibbles(t)
    if reorder:
        nib = unreorder(nib)
    return cut_columns(nib, rows, 8 * words, cols)


def quark_tensor(tensors, used, prefix, flat, nested):
    a, b = prefix + "." + flat, prefix + "." + nested
    if a in tensors and b in tensors:
        raise FormatError("module %s stores both %s and %s" % (prefix, a, b))
    return take(tensors, used, b if b in tensors else a, prefix)


def quark_linear(tensors, used, prefix, spec, reorder):
    w = take(tensors, used, prefix + ".weight", prefix)
    s = quark_tensor(tensors, used, prefix, "weight_scale", "weight_quantizer.scale")
    zt = quark_tensor(tensors, used, prefix, "weight_zero_point", "weight_quantizer.zero_point")
    signed = spec["dtype"] == "int4"
    if len(w.shape) != 2 or len(s.shape) != 2:
        raise FormatError("module %s: weight %s / scale %s are not 2-D" % (prefix, w.shape, s.shape))
    k, n = w.shape[0], s.shape[1]
    g = k if spec["group_size"] == -1 else spec["group_size"]
    if k % g:
        raise FormatError("module %s: in_features %d is not a multiple of group_size %d" % (prefix, k, g))
    groups = k // g
    check_shape(s, [groups, n])
    codes = transpose(quark_unpack(w, k, n, reorder), k, n)                 # [n, k]
    zeros = transpose(quark_unpack(zt, groups, n, reorder), groups, n)      # [n, groups]
    scales = to_rows(floats(s), groups, n)
    check_scales(s, scales)
    if signed:
        if any(zeros):
            raise FormatError("module %s: %s: dtype int4 stores zero points 0, found a non-zero one" % (prefix, zt.name))
        codes, zeros = codes.translate(_XOR8), [8] * len(scales)  # two's-complement q -> q + 8
    return Int4Linear(n, k, g, codes, list(zeros), scales)


def quark_load(qc, tensors):
    want(not qc.get("kv_cache_quant_config"), "kv_cache_quant_config", qc.get("kv_cache_quant_config"), "{} (no KV-cache quantization)")
    want(qc.get("softmax_quant_spec") is None, "softmax_quant_spec", qc.get("softmax_quant_spec"), "null")
    export = qc.get("export") or {}
    fmt, pack = export.get("weight_format", "real_quantized"), export.get("pack_method", "reorder")
    want(fmt in ("real_quantized", "fake_quantized"), "export.weight_format", fmt, '"real_quantized" or "fake_quantized"')
    want(pack in ("reorder", "order"), "export.pack_method", pack, '"reorder" or "order"')
    quark_check_layer_config("global_quant_config", qc.get("global_quant_config") or {})
    for key, cfg in (qc.get("layer_quant_config") or {}).items():
        quark_check_layer_config("layer_quant_config[%r]" % key, cfg)
    suffixes = ("weight_scale", "weight_zero_point", "weight_quantizer.scale", "weight_quantizer.zero_point")
    linears, used = {}, set()
    for prefix in linear_candidates(tensors, suffixes):
        spec, rule = quark_resolve(qc, prefix)
        w = tensors.get(prefix + ".weight")
        stored = (w is not None and w.dtype == "I32") or any(prefix + "." + s in tensors for s in suffixes)
        if fmt == "fake_quantized":
            for suf in suffixes:  # the stored float weight is the model (SPEC §1.4)
                used.add(prefix + "." + suf)
            continue
        check_agreement(prefix, stored, spec is not None, rule)
        if spec is None:
            continue
        quark_check_spec(spec, rule)
        linears[prefix] = quark_linear(tensors, used, prefix, spec, pack == "reorder")
        check_known_tensors(tensors, used, prefix, ("bias",))
    return linears, used


# ---------------------------------------------------------------------------------------------
# compressed-tensors pack-quantized (SPEC §2.2, §9.2-9.3)

_CT_CLASSES = ("Linear", "Module")


def ct_match(entry, name):
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    return entry == name


def ct_resolve(qc, name):
    for entry in qc.get("ignore") or []:
        if ct_match(entry, name) or entry in _CT_CLASSES:
            return None, None, "ignore %r" % entry
    groups = qc.get("config_groups") or {}
    for key, grp in groups.items():  # names and regexes first, across groups in order
        for entry in grp.get("targets") or []:
            if ct_match(entry, name):
                return key, grp, "config_groups.%s target %r" % (key, entry)
    for key, grp in groups.items():  # then class names
        for entry in grp.get("targets") or []:
            if entry in _CT_CLASSES:
                return key, grp, "config_groups.%s target %r" % (key, entry)
    return None, None, "no config group targets it"


def ct_check_group(qc, key, grp):
    where = "config_groups.%s" % key
    want(grp.get("format", qc.get("format")) == "pack-quantized", where + ".format", grp.get("format", qc.get("format")),
         '"pack-quantized"')
    for k in ("input_activations", "output_activations"):
        want(grp.get(k) is None, where + "." + k, grp.get(k), "null (weight-only)")
    w = grp.get("weights") or {}
    want(w.get("num_bits") == 4, where + ".weights.num_bits", w.get("num_bits"), "4")
    want(w.get("type", "int") == "int", where + ".weights.type", w.get("type"), '"int"')
    want(not w.get("dynamic"), where + ".weights.dynamic", w.get("dynamic"), "false")
    want(w.get("block_structure") is None, where + ".weights.block_structure", w.get("block_structure"), "null")
    g = w.get("group_size")
    strategy = w.get("strategy") or ("group" if isinstance(g, int) and g > 0 else "channel" if g == -1 else "tensor")
    want(strategy in ("group", "channel"), where + ".weights.strategy", strategy, '"group" or "channel"')
    if strategy == "group":
        want(isinstance(g, int) and g > 0, where + ".weights.group_size", g, "a positive int")
    actorder = {"dynamic": "group", "static": "weight"}.get(w.get("actorder"), w.get("actorder"))
    want(actorder in (None, "group", "weight"), where + ".weights.actorder", w.get("actorder"), 'null, "group" or "weight"')
    return strategy, g, bool(w.get("symmetric")), actorder


def ct_linear(tensors, used, prefix, strategy, g, sym, actorder):
    p = take(tensors, used, prefix + ".weight_packed", prefix)
    s = take(tensors, used, prefix + ".weight_scale", prefix)
    shape = list(ints(take(tensors, used, prefix + ".weight_shape", prefix)))
    if len(shape) != 2 or len(p.shape) != 2 or len(s.shape) != 2:
        raise FormatError("module %s: weight_shape %s, weight_packed %s, weight_scale %s: expected 2-D"
                          % (prefix, shape, p.shape, s.shape))
    n, k = shape
    check_shape(p, [n, (k + 7) // 8], " (weight_shape %s)" % shape)
    if strategy == "channel" or k < g:
        g = k  # one group per row (SPEC §9.3)
    if k % g:
        raise FormatError("module %s: in_features %d is not a multiple of group_size %d" % (prefix, k, g))
    groups = k // g
    check_shape(s, [n, groups])
    codes = cut_columns(nibbles(p), n, 8 * p.shape[1], k)
    zname = prefix + ".weight_zero_point"
    if sym:
        if zname in tensors:
            raise FormatError("module %s: symmetric config but %s is stored (SPEC §9.3)" % (prefix, zname))
        zeros = [8] * (n * groups)
    else:
        zt = take(tensors, used, zname, prefix)
        check_shape(zt, [(n + 7) // 8, groups])
        zeros = list(ct_zero_rows(nibbles(zt), zt.shape[0], groups, n))
    scales = list(floats(s))
    check_scales(s, scales)
    g_idx = None
    if prefix + ".weight_g_idx" in tensors:
        gt = take(tensors, used, prefix + ".weight_g_idx", prefix)
        g_idx = check_g_idx(gt, ints(gt), k, groups, actorder != "group", g)
    elif actorder == "group":
        raise FormatError("module %s: actorder \"group\" but no weight_g_idx tensor" % prefix)
    return Int4Linear(n, k, g, codes, zeros, scales, g_idx)


def ct_zero_rows(nib, word_rows, groups, n):
    """weight_zero_point [ceil(n/8), groups] packed along n (dim 0) -> [n, groups] nibbles."""
    # Word (r, c) holds outputs 8r..8r+7 of group c, output 8r+j at shift 4j.
    span = 8 * groups
    rows = [nib[r * span + j:(r + 1) * span:8] for r in range(word_rows) for j in range(8)]
    return b"".join(rows[:n])


def ct_load(qc, tensors):
    want(qc.get("format") in (None, "pack-quantized") or qc.get("format") == "mixed-precision", "format", qc.get("format"),
         '"pack-quantized"')
    want(qc.get("quantization_status", "compressed") == "compressed", "quantization_status",
         qc.get("quantization_status"), '"compressed"')
    want(qc.get("kv_cache_scheme") is None, "kv_cache_scheme", qc.get("kv_cache_scheme"), "null")
    for key in ("transform_config", "sparsity_config"):
        v = qc.get(key)
        want(not v or (isinstance(v, dict) and v.get("format") in (None, "dense")), key, v, "null or dense")
    suffixes = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")
    linears, used = {}, set()
    for prefix in linear_candidates(tensors, suffixes):
        key, grp, rule = ct_resolve(qc, prefix)
        stored = any(prefix + "." + s in tensors for s in suffixes)
        check_agreement(prefix, stored, grp is not None, rule)
        if grp is None:
            continue
        strategy, g, sym, actorder = ct_check_group(qc, key, grp)
        linears[prefix] = ct_linear(tensors, used, prefix, strategy, g, sym, actorder)
        check_known_tensors(tensors, used, prefix, ("bias",))
    return linears, used


# ---------------------------------------------------------------------------------------------
# AutoAWQ GEMM (SPEC §2.3, §9.5)

def awq_settings(qc):
    def one(a, b):
        if a in qc and b in qc and qc[a] != qc[b]:
            raise FormatError("quantization_config: %s = %s and %s = %s disagree" % (a, qc[a], b, qc[b]))
        return qc.get(a, qc.get(b))
    bits, g = one("bits", "w_bit"), one("group_size", "q_group_size")
    want(bits == 4, "bits", bits, "4")
    want(isinstance(g, int) and (g > 0 or g == -1), "group_size", g, "a positive int or -1")
    version = str(qc.get("version", "gemm")).lower()
    want(version == "gemm", "version", qc.get("version"), '"gemm"')
    skip = qc.get("modules_to_not_convert") or []
    want(isinstance(skip, list), "modules_to_not_convert", skip, "null or a list")
    return g, bool(qc.get("zero_point", True)), skip, bool(qc.get("lm_head", False))


def awq_linear(tensors, used, prefix, g, zero_point):
    qw = take(tensors, used, prefix + ".qweight", prefix)
    s = take(tensors, used, prefix + ".scales", prefix)
    if len(qw.shape) != 2 or len(s.shape) != 2:
        raise FormatError("module %s: qweight %s / scales %s are not 2-D" % (prefix, qw.shape, s.shape))
    k, n = qw.shape[0], s.shape[1]
    if n % 8:
        raise FormatError("module %s: out_features %d is not a multiple of 8 (AutoAWQ GEMM has no padding)" % (prefix, n))
    g = k if g == -1 else g
    if k % g:
        raise FormatError("module %s: in_features %d is not a multiple of group_size %d" % (prefix, k, g))
    groups = k // g
    check_shape(qw, [k, n // 8])
    check_shape(s, [groups, n])
    codes = transpose(unreorder(nibbles(qw)), k, n)
    zname = prefix + ".qzeros"
    if zero_point or zname in tensors:
        zt = take(tensors, used, zname, prefix)
        check_shape(zt, [groups, n // 8])
        zeros = list(transpose(unreorder(nibbles(zt)), groups, n))
        if not zero_point and any(z != 8 for z in zeros):
            raise FormatError("module %s: zero_point false means every zero is 8; %s holds others" % (prefix, zname))
    else:
        zeros = [8] * (n * groups)
    scales = to_rows(floats(s), groups, n)
    check_scales(s, scales)
    return Int4Linear(n, k, g, codes, zeros, scales)


def awq_load(qc, tensors):
    g, zero_point, skip, lm_head = awq_settings(qc)
    suffixes = ("qweight", "qzeros", "scales")
    linears, used = {}, set()
    for prefix in linear_candidates(tensors, suffixes):
        hit = [m for m in skip if m in prefix]  # substring rule (SPEC §2.3, §9.5)
        if hit:
            quant, rule = False, "modules_to_not_convert entry %r" % hit[0]
        elif prefix.split(".")[-1] == "lm_head":
            quant, rule = lm_head, "lm_head %s" % json.dumps(lm_head)
        else:
            quant, rule = True, "every other linear"
        check_agreement(prefix, any(prefix + "." + s in tensors for s in suffixes), quant, rule)
        if quant:
            linears[prefix] = awq_linear(tensors, used, prefix, g, zero_point)
            check_known_tensors(tensors, used, prefix, ("bias",))
    return linears, used


# ---------------------------------------------------------------------------------------------
# GPTQ (SPEC §3.2, §9.1, §9.4)

_GPTQ_SHARED = ("quant_method", "bits", "group_size", "desc_act", "sym", "checkpoint_format", "format",
                "lm_head", "dynamic", "static_groups")


def gptq_config(cfg_qc, file_qc):
    if cfg_qc is not None and file_qc is not None:
        for key in _GPTQ_SHARED:
            if key in cfg_qc and key in file_qc and cfg_qc[key] != file_qc[key]:
                raise FormatError("config.json quantization_config.%s = %s but quantize_config.json has %s"
                                  % (key, json.dumps(cfg_qc[key]), json.dumps(file_qc[key])))
    qc = dict(file_qc or {})
    qc.update(cfg_qc or {})
    fmt = qc.get("checkpoint_format", qc.get("format", "gptq"))
    want(fmt in ("gptq", "gptq_v2"), "checkpoint_format", fmt, '"gptq" (v1) or "gptq_v2"')
    want(not qc.get("modules_in_block_to_quantize"), "modules_in_block_to_quantize",
         qc.get("modules_in_block_to_quantize"), "empty")
    dynamic = qc.get("dynamic") or {}
    want(isinstance(dynamic, dict), "dynamic", dynamic, "an object")
    for key, over in dynamic.items():
        try:
            re.compile(key[2:] if key[:2] in ("+:", "-:") else key)
        except re.error as e:
            raise FormatError("quantization_config.dynamic: key %r is not a valid regex: %s" % (key, e))
        want(isinstance(over, dict), "dynamic[%r]" % key, over, "an object")
    return qc, fmt == "gptq"


def gptq_spec(qc, name):
    """(quantized, bits, group_size, sym, desc_act, rule) for module `name`."""
    spec = {k: qc.get(k) for k in ("bits", "group_size", "sym", "desc_act")}
    if name.split(".")[-1] == "lm_head" and not qc.get("lm_head"):
        return None, "lm_head false"
    for key, over in (qc.get("dynamic") or {}).items():
        neg, pat = key.startswith("-:"), key[2:] if key[:2] in ("+:", "-:") else key
        if re.match(pat, name):
            if neg:
                return None, "dynamic %r" % key
            spec.update({k: v for k, v in over.items() if k in spec})
            return spec, "dynamic %r" % key
    return spec, "the global spec"


def gptq_linear(tensors, used, prefix, spec, v1):
    want(spec["bits"] == 4, "bits (module %s)" % prefix, spec["bits"], "4")
    qw = take(tensors, used, prefix + ".qweight", prefix)
    s = take(tensors, used, prefix + ".scales", prefix)
    zt = take(tensors, used, prefix + ".qzeros", prefix)
    if len(qw.shape) != 2 or len(s.shape) != 2:
        raise FormatError("module %s: qweight %s / scales %s are not 2-D" % (prefix, qw.shape, s.shape))
    k, n = 8 * qw.shape[0], qw.shape[1]
    g = k if spec["group_size"] == -1 else spec["group_size"]
    if not isinstance(g, int) or g <= 0 or k % g:
        raise FormatError("module %s: in_features %d and group_size %s do not make whole groups" % (prefix, k, g))
    groups = k // g
    check_shape(s, [groups, n])
    check_shape(zt, [groups, (n + 7) // 8])
    # qweight word (r, c): inputs 8r..8r+7 of output c, input 8r+j at shift 4j.
    codes = gptq_codes(nibbles(qw), k, n)
    zs = cut_columns(nibbles(zt), groups, 8 * zt.shape[1], n)  # [groups, n]
    if v1:
        for i, z in enumerate(zs):
            if z == 15:
                raise FormatError("module %s: %s group %d output %d stores 15: z = 16 cannot be a v1 zero point"
                                  " (SPEC §9.1)" % (prefix, zt.name, i // n, i % n))
        zs = bytes(z + 1 for z in zs)
    zeros = list(transpose(zs, groups, n))
    if spec["sym"]:
        for i, z in enumerate(zeros):
            if z != 8:
                raise FormatError("module %s: sym true needs every zero point 8; output %d group %d has %d"
                                  % (prefix, i // groups, i % groups, z))
    scales = to_rows(floats(s), groups, n)
    check_scales(s, scales)
    g_idx = None
    if prefix + ".g_idx" in tensors:
        gt = take(tensors, used, prefix + ".g_idx", prefix)
        g_idx = check_g_idx(gt, ints(gt), k, groups, not spec["desc_act"], g)
    elif spec["desc_act"]:
        raise FormatError("module %s: desc_act true but no g_idx tensor (SPEC §9.4)" % prefix)
    return Int4Linear(n, k, g, codes, zeros, scales, g_idx)


def gptq_codes(nib, k, n):
    """qweight nibbles [k/8, n, 8] -> codes [n, k]."""
    rows = []
    for c in range(n):
        col = bytearray(k)
        for j in range(8):
            col[j::8] = nib[c * 8 + j::8 * n]
        rows.append(bytes(col))
    return b"".join(rows)


def gptq_load(qc, tensors):
    v1 = qc.pop("__v1__")
    suffixes = ("qweight", "qzeros", "scales", "g_idx")
    linears, used = {}, set()
    for prefix in linear_candidates(tensors, suffixes):
        spec, rule = gptq_spec(qc, prefix)
        check_agreement(prefix, any(prefix + "." + s in tensors for s in suffixes), spec is not None, rule)
        if spec is not None:
            linears[prefix] = gptq_linear(tensors, used, prefix, spec, v1)
            check_known_tensors(tensors, used, prefix, ("bias",))
    return linears, used


# ---------------------------------------------------------------------------------------------
# driver

_COPIED = ("generation_config.json", "special_tokens_map.json", "added_tokens.json", "merges.txt", "vocab.json",
           "tokenizer.model", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f, object_pairs_hook=dict)
    except ValueError as e:
        raise FormatError("%s: not valid JSON: %s" % (path, e))


def read_config(src):
    cfg_path, qfile = os.path.join(src, "config.json"), os.path.join(src, "quantize_config.json")
    if not os.path.exists(cfg_path):
        raise FormatError("%s: no config.json" % src)
    config = load_json(cfg_path)
    cfg_qc = config.pop("quantization_config", None)
    file_qc = load_json(qfile) if os.path.exists(qfile) else None
    if cfg_qc is None and file_qc is None:
        raise FormatError("%s: config.json has no quantization_config (and there is no quantize_config.json)" % cfg_path)
    method = (cfg_qc or file_qc).get("quant_method", "gptq" if cfg_qc is None else None)
    if method == "gptq":
        qc, v1 = gptq_config(cfg_qc, file_qc)
        qc["__v1__"] = v1
    else:
        if file_qc is not None:
            raise FormatError("%s: quantize_config.json next to a %r config: not understood" % (src, method))
        qc = cfg_qc
    return config, method, qc


def dequantize(src, dst):
    config, method, qc = read_config(src)
    loaders = {"quark": quark_load, "compressed-tensors": ct_load, "awq": awq_load, "gptq": gptq_load}
    if method not in loaders:
        raise FormatError("%s/config.json: quantization_config.quant_method is %s, expected one of %s"
                          % (src, json.dumps(method), ", ".join(sorted(loaders))))
    tensors = read_checkpoint(src)
    linears, used = loaders[method](qc, tensors)
    out = {}
    for name, t in tensors.items():
        if name not in used:
            out[name] = (t.dtype, t.shape, t.data)
    for prefix, lin in linears.items():
        out[prefix + ".weight"] = ("F32", [lin.n, lin.k], lin.dense())
    os.makedirs(dst, exist_ok=True)
    write_safetensors(os.path.join(dst, "model.safetensors"), out)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    for fname in _COPIED:
        if os.path.isfile(os.path.join(src, fname)):
            shutil.copyfile(os.path.join(src, fname), os.path.join(dst, fname))
    return method, len(linears)


# ---------------------------------------------------------------------------------------------
# self-test: the specification's own test vectors (SPEC §7 TV-1, TV-2, TV-3)

_TV1_W = [-1.0, -0.75, -0.5, 0.0, 0.5, 1.0, 2.0, 2.75, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 3.75,
          -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.75, -3.75, -3.0, -2.0, -1.0, 0.0, -0.25, -0.5, -1.5]


def _t(name, dtype, shape, values):
    code = {"I32": "<%dI", "I64": "<%dq", "F32": "<%df"}[dtype] % len(values)
    return name, Tensor(name, dtype, shape, struct.pack(code, *values), "self-test")


def _expect(label, loader, qc, tensors, want):
    linears, _ = loader(qc, dict(tensors))
    got = list(_le_array("f", linears["m"].dense()))
    if got != want:
        raise FormatError("self-test %s: dequantized %s, expected %s" % (label, got, want))


def self_test():
    quarter = [0.25] * 4
    spec = {"dtype": "uint4", "qscheme": "per_group", "ch_axis": 1, "group_size": 8}
    for pack, words, zp in (
            ("order", [0x00, 0x21, 0x42, 0x64, 0x86, 0xA8, 0xCC, 0xFF, 0x02, 0x34, 0x76, 0xB8, 0xFA, 0xEC, 0xDE, 0x9F],
             [0x84, 0xF0]),
            ("reorder", [0x00000000, 0x00020001, 0x00040002, 0x00060004, 0x00080006, 0x000A0008, 0x000C000C,
                         0x000F000F, 0x00000002, 0x00030004, 0x00070006, 0x000B0008, 0x000F000A, 0x000E000C,
                         0x000D000E, 0x0009000F], [0x00080004, 0x000F0000])):
        qc = {"export": {"pack_method": pack}, "global_quant_config": {"weight": spec}, "exclude": ["lm_head"]}
        _expect("TV-1 Quark " + pack, quark_load, qc, [_t("m.weight", "I32", [16, 1], words),
                _t("m.weight_scale", "F32", [2, 2], quarter), _t("m.weight_zero_point", "I32", [2, 1], zp)], _TV1_W)
    for pack, word in (("reorder", 0xE31F7208), ("order", 0xE73210F8)):
        qc = {"export": {"pack_method": pack}, "global_quant_config": {"weight": dict(spec, dtype="int4", group_size=1)}}
        _expect("TV-3 Quark int4 " + pack, quark_load, qc, [_t("m.weight", "I32", [1, 1], [word]),
                _t("m.weight_scale", "F32", [1, 8], [1.0] * 8), _t("m.weight_zero_point", "I32", [1, 1], [0])],
                [-8.0, -1.0, 0.0, 1.0, 2.0, 3.0, 7.0, -2.0])
    ct = {"format": "pack-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "symmetric": False, "group_size": 8, "strategy": "group"}}}}
    _expect("TV-1 compressed-tensors", ct_load, ct, [_t("m.weight_packed", "I32", [2, 2], [0xFC864210, 0xFECA8642,
            0xFCA86420, 0x9DEFB730]), _t("m.weight_scale", "F32", [2, 2], quarter),
            _t("m.weight_zero_point", "I32", [1, 2], [0x84, 0xF0]), _t("m.weight_shape", "I64", [2], [2, 16])], _TV1_W)
    gptq = [_t("m.qweight", "I32", [2, 2], [0xFC864210, 0xFCA86420, 0xFECA8642, 0x9DEFB730]),
            _t("m.scales", "F32", [2, 2], quarter), _t("m.g_idx", "I32", [16], [c // 8 for c in range(16)])]
    qc = {"bits": 4, "group_size": 8, "desc_act": False, "sym": False}
    _expect("TV-1 GPTQ v2", gptq_load, dict(qc, __v1__=False), gptq + [_t("m.qzeros", "I32", [2, 1], [0x84, 0xF0])],
            _TV1_W)
    codes = [0, 1, 2, 4, 6, 8, 12, 15, 2, 4, 6, 8, 10, 12, 14, 15, 0, 2, 4, 6, 8, 10, 12, 15, 0, 3, 7, 11, 15, 14, 13, 9]
    one_group = [_t("m.qweight", "I32", [2, 2], [0xFC864210, 0xFCA86420, 0xFECA8642, 0x9DEFB730]),
                 _t("m.scales", "F32", [1, 2], [0.25, 0.25]), _t("m.qzeros", "I32", [1, 1], [0x73])]
    _expect("TV-1 codes, one group, GPTQ v1 zeros 4 and 8 stored as 3 and 7", gptq_load,
            dict(qc, group_size=16, __v1__=True), one_group, [(q - (4, 8)[i // 16]) * 0.25 for i, q in enumerate(codes)])
    swapped = [_t("m.g_idx", "I32", [16], [1 - c // 8 for c in range(16)])]  # act-order: groups swapped
    zeros = ((4, 0), (8, 15))  # [out][group], TV-1
    _expect("TV-1 codes, GPTQ v2 with a non-natural g_idx", gptq_load, dict(qc, desc_act=True, __v1__=False),
            gptq[:2] + swapped + [_t("m.qzeros", "I32", [2, 1], [0x84, 0xF0])],
            [(q - zeros[i // 16][1 - (i % 16) // 8]) * 0.25 for i, q in enumerate(codes)])
    try:  # TV-1's v1 words: out0 of group 1 has z = 0, stored as 15 (SPEC §9.1)
        _expect("TV-1 GPTQ v1", gptq_load, dict(qc, __v1__=True),
                gptq + [_t("m.qzeros", "I32", [2, 1], [0xEEEEEF73, 0xEEEEEFDF])], _TV1_W)
        raise FormatError("self-test TV-1 GPTQ v1: a zero point of 0 stored as v1 was accepted")
    except FormatError as e:
        if "stores 15" not in str(e):
            raise
    awq = {"bits": 4, "group_size": 1, "version": "GEMM"}
    _expect("TV-2 AutoAWQ", awq_load, awq, [_t("m.qweight", "I32", [1, 1], [0x86427531]),
            _t("m.scales", "F32", [1, 8], [1.0] * 8), _t("m.qzeros", "I32", [1, 1], [0])],
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        try:
            self_test()
        except FormatError as e:
            sys.stderr.write("dequantize.py: %s\n" % e)
            return 1
        print("self-test: SPEC test vectors TV-1, TV-2, TV-3 read back exactly")
        return 0
    if len(argv) != 3:
        sys.stderr.write("usage: %s QUANTIZED_DIR OUTPUT_DIR | --self-test\n" % argv[0])
        return 2
    try:
        method, n = dequantize(argv[1], argv[2])
    except FormatError as e:
        sys.stderr.write("dequantize.py: error: %s\n" % e)
        return 1
    except (OSError, KeyError, TypeError, AttributeError) as e:
        sys.stderr.write("dequantize.py: error: %s: %s\n" % (type(e).__name__, e))
        return 1
    print("%s: %d quantized linears dequantized to F32 in %s" % (method, n, argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
