#!/usr/bin/env python3
"""Our checkpoint files against the reference safetensors library (Python package `safetensors`,
with numpy): it reads a rank checkpoint written by write_moe_checkpoint_example with the expected
names, shapes, values and metadata, lays the same tensors out exactly as we do, and writes a file
our reader reads back. Exits 77 (ctest: skipped) when the packages are not installed;
scripts/install-ops-tools installs them into its venv, which ctest runs this with.

usage: safetensors_reference_test.py WRITE_MOE_CHECKPOINT_EXAMPLE WORK_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys

try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save, save_file
except ImportError as error:
    print(f"skipped: {error}")
    sys.exit(77)

# The example's job: rank 1 of ep 2 (experts 2 and 3), see write_moe_checkpoint_example.cc.
H, F, E, S, LAYERS, LOCAL, STEP = 4, 3, 4, 1, 2, 2, 3


def expected_tensors():
    """name -> array, from the flat layout that worker/engine/cpu/moe_model.h documents."""
    rep_per_layer = H * E + S * (H * 2 * F + F * H)
    exp_per_layer = LOCAL * (H * 2 * F + F * H)
    where = {}
    for l in range(LAYERS):
        r = l * rep_per_layer
        where[f"layers.{l}.router.weight"] = (r, (H, E))
        for s in range(S):
            where[f"layers.{l}.shared_experts.{s}.w1"] = (r + H * E + s * H * 2 * F, (H, 2 * F))
            where[f"layers.{l}.shared_experts.{s}.w2"] = (
                r + H * E + S * H * 2 * F + s * F * H, (F, H))
        e = 100000 + l * exp_per_layer
        where[f"layers.{l}.experts.w1"] = (e, (LOCAL, H, 2 * F))
        where[f"layers.{l}.experts.w2"] = (e + LOCAL * H * 2 * F, (LOCAL, F, H))
    out = {}
    for name, (start, shape) in where.items():
        index = np.arange(start, start + int(np.prod(shape)), dtype=np.float32).reshape(shape)
        out[name] = index
        out["optimizer.exp_avg." + name] = -index
        out["optimizer.exp_avg_sq." + name] = index + np.float32(0.5)
    return out


def split(data):
    n = struct.unpack("<Q", data[:8])[0]
    return n, json.loads(data[8:8 + n]), data[8 + n:]


def main():
    tool, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    subprocess.run([tool, "write", work], check=True)
    with open(os.path.join(work, "manifest-rank-1.json")) as f:
        manifest = json.load(f)
    assert manifest["step"] == STEP and manifest["identity"]["rank"] == 1, manifest
    path = os.path.join(work, manifest["files"][0]["name"])

    # The reference reader: names, shapes, dtypes, values, metadata.
    tensors = load_file(path)
    expected = expected_tensors()
    assert sorted(tensors) == sorted(expected), sorted(set(tensors) ^ set(expected))
    for name, value in expected.items():
        assert tensors[name].dtype == np.float32 and tensors[name].shape == value.shape, name
        np.testing.assert_array_equal(tensors[name], value, err_msg=name)
    with safe_open(path, framework="numpy") as f:
        metadata = f.metadata()
    for key, value in {"step": "3", "rank": "1", "ep": "2", "first_expert": "2",
                       "local_experts": "2", "seed": "1234", "format": "pt",
                       "rng_state": '{"seed":1234,"step":3}'}.items():
        assert metadata.get(key) == value, (key, metadata.get(key))

    # The reference writer lays the same tensors out identically (its metadata key order is
    # unspecified, so headers are compared as parsed JSON, tensor order included).
    with open(path, "rb") as f:
        ours = f.read()
    n, our_header, our_data = split(ours)
    _, their_header, their_data = split(save(tensors, metadata=metadata))
    assert n % 8 == 0 and manifest["files"][0]["bytes"] == len(ours)
    assert list(our_header.items())[1:] == list(their_header.items())[1:]
    assert our_header["__metadata__"] == their_header["__metadata__"]
    assert our_data == their_data

    # Our reader on a file the reference writer wrote (several dtypes, an empty tensor, a scalar).
    theirs = {"w": np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5,
              "ids": np.array([3, -1, 7], dtype=np.int32),
              "big": np.array([2**40, -5], dtype=np.int64),
              "empty": np.zeros((0, 4), dtype=np.float32),
              "scalar": np.array(1.25, dtype=np.float32)}
    their_path = os.path.join(work, "reference.safetensors")
    save_file(theirs, their_path, metadata={"producer": "reference"})
    lines = subprocess.run([tool, "read", their_path], check=True, capture_output=True,
                           text=True).stdout.splitlines()
    dtypes = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64"}
    want = sorted(f"{name} {dtypes[a.dtype]} {'x'.join(map(str, a.shape))} {a.tobytes().hex()}"
                  for name, a in theirs.items())
    want.append("metadata producer=reference")
    assert lines == want, "\n".join(lines + ["--- expected"] + want)
    print("ok: the reference safetensors library and dropless read each other's files")


if __name__ == "__main__":
    main()
