#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/ (python3 stdlib only).

Each seed is a small valid input, or one a step away from valid, so that the fuzzers start
from the formats' structure: safetensors files, config.json texts, JobSpec JSON, and
length-delimited TensorChunk streams (protobuf wire format written by hand below)."""
import json
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, blob = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + blob


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def field(num, wire, payload):
    key = varint((num << 3) | wire)
    if wire == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload


DTYPES = {"F32": (1, 4), "F64": (2, 8), "BF16": (3, 2), "F16": (4, 2), "I32": (5, 4),
          "I64": (6, 8), "U8": (7, 1)}


def chunk(header=None, offset=0, data=b"", last=False):
    m = b""
    if header is not None:
        name, dtype, shape, total = header
        h = field(1, 2, name.encode()) + field(2, 0, DTYPES[dtype][0])
        if shape:
            h += field(3, 2, b"".join(varint(s) for s in shape))
        h += field(4, 0, total)
        m += field(1, 2, h)
    if offset:
        m += field(2, 0, offset)
    if data:
        m += field(3, 2, data)
    if last:
        m += field(4, 0, 1)
    return varint(len(m)) + m


def tensor_stream(name, dtype, shape, piece):
    n = 1
    for s in shape:
        n *= s
    raw = bytes((i * 37) & 0xFF for i in range(n * DTYPES[dtype][1]))
    if not raw:
        return chunk((name, dtype, shape, 0), last=True)
    out, off = b"", 0
    while off < len(raw):
        part = raw[off:off + piece]
        out += chunk((name, dtype, shape, len(raw)) if off == 0 else None, off, part,
                     off + len(part) == len(raw))
        off += len(part)
    return out


def main():
    f32 = lambda vals: struct.pack("<%df" % len(vals), *vals)
    write("safetensors", "two_f32", safetensors(
        [("a", "F32", [2, 3], f32([1, 2, 3, 4, 5, 6])), ("b", "F32", [], f32([7]))]))
    write("safetensors", "dtypes", safetensors(
        [("bf", "BF16", [2], b"\x80\x3f\x00\x40"), ("h", "F16", [1], b"\x00\x3c"),
         ("i", "I64", [1], struct.pack("<q", -5)), ("u", "U8", [3], b"abc"),
         ("d", "F64", [1], struct.pack("<d", 2.5)), ("n", "I32", [0, 4], b"")],
        {"format": "pt"}))
    write("safetensors", "truncated", safetensors([("a", "F32", [4], f32([1, 2, 3, 4]))])[:-3])
    write("safetensors", "empty_header", struct.pack("<Q", 2) + b"{}")

    base = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 256, "state_size": 16,
            "conv_kernel": 4, "expand": 2, "time_step_rank": "auto", "layer_norm_epsilon": 1e-5,
            "use_bias": False, "use_conv_bias": True, "tie_word_embeddings": True,
            "model_type": "mamba", "architectures": ["MambaForCausalLM"]}
    write("config", "full", json.dumps(base, indent=1))
    write("config", "minimal", json.dumps({"hidden_size": 8, "num_hidden_layers": 1,
                                           "vocab_size": 16}))
    write("config", "rank_int", json.dumps(dict(base, time_step_rank=3, expand=1)))
    write("config", "bad_type", json.dumps(dict(base, hidden_size="64")))

    write("job_spec", "init_builtin", json.dumps(
        {"init": {"hidden_size": 32, "layers": 2, "vocab_size": 256, "seed": "7"},
         "context_length": "512", "steps": "3", "chunk": "64"}))
    write("job_spec", "optimizer", json.dumps(
        {"init": {"hidden_size": 16, "layers": 1, "vocab_size": 300, "state_size": 8,
                  "conv_kernel": 2, "expand": 1, "dt_rank": 2},
         "contextLength": 100, "steps": 1,
         "optimizer": {"lr": 0.001, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                       "weightDecay": 0.1, "warmupSteps": 2, "minLrRatio": 0.1,
                       "gradClip": 1.0},
         "checkpointEvery": 1, "dtype": "f32"}))
    write("job_spec", "text_files", json.dumps(
        {"init": {"hidden_size": 8, "layers": 1, "vocab_size": 256},
         "text_files": {"paths": ["/usr/share/common-licenses/GPL-3"]},
         "context_length": 64, "steps": 2}))
    write("job_spec", "token_file_missing", json.dumps(
        {"model_dir": "/nonexistent/model", "token_file": "/nonexistent/t.u16",
         "context_length": 64, "steps": 2, "window": 0}))
    write("job_spec", "over_limit", json.dumps(
        {"init": {"hidden_size": 8192, "layers": 100, "vocab_size": 50000},
         "context_length": 4194304, "steps": 1}))

    write("tensor_codec", "one_f32", tensor_stream("u", "F32", [3, 4], 1 << 20))
    write("tensor_codec", "pieces", tensor_stream("grad", "F32", [5, 7], 16) +
          tensor_stream("lambda", "BF16", [2, 3], 4))
    write("tensor_codec", "empty_and_scalar", tensor_stream("e", "F64", [0, 3], 8) +
          tensor_stream("s", "I64", [], 8) + tensor_stream("b", "U8", [9], 2))
    write("tensor_codec", "missing_last",
          chunk(("x", "F32", [2], 8), 0, b"\x00" * 4, False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
