#!/usr/bin/env python3
"""A GGUF with another model's exact layout and random weights: the same metadata and
tokenizer, the same tensors with the same shapes and quantization types, random values.

    python bench/random_weights.py default-target /tmp/target-random.gguf
    python bench/random_weights.py layout default-target /tmp/target     # /tmp/target.header + .json
    python bench/random_weights.py fill /tmp/target /tmp/target-random.gguf

What a pass costs depends on the layout alone, not on the values, so such a file measures the
cost curve of a model (``bench/verify_cost.py --model FILE``) on a machine the real weights
cannot reach: ``layout`` keeps the few megabytes of a GGUF's header (its metadata and tensor
table) and the offsets of its tensors; ``fill`` (numpy alone, no gguf package) writes the
header back and random tensor data after it.  The tokenizer is the real one, so prompts
tokenize as with the real model; what it generates is noise, and acceptance measured with
it says nothing.

Values: quantized blocks get random quants and a fixed scale per block chosen so the
weights' spread is about 0.02 (norms are 1.0, other float tensors N(0, 0.02)), which keeps
activations finite through the layers.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

# type name -> (block bytes, elements per block, ((byte offset, value) of each f16 scale)).
# The values give the dequantized weights a spread of about 0.02 and a mean near 0 for uniform
# random quants (the K-quants' dmin offsets the mean of d * scale * q).
BLOCKS = {
    "Q4_0": (18, 32, ((0, 4.3e-3),)),
    "Q5_0": (22, 32, ((0, 2.2e-3),)),
    "Q8_0": (34, 32, ((0, 2.7e-4),)),
    "Q4_K": (144, 256, ((0, 7.7e-5), (2, 5.8e-4))),
    "Q5_K": (176, 256, ((0, 3.8e-5), (2, 5.9e-4))),
    "Q6_K": (210, 256, ((208, 1.5e-5),)),
}
FLOATS = {"F32": np.float32, "F16": np.float16}


def random_blocks(type_name: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """n_blocks blocks of a quantized type as a (n_blocks, block bytes) uint8 array: random
    quants, every f16 scale set to its value in BLOCKS."""
    size, _, scales = BLOCKS[type_name]
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off, value in scales:
        blocks[:, off:off + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
    return blocks


def layout(src: str, dst: str) -> None:
    """Write dst.header (the bytes before src's tensor data) and dst.json (the tensors)."""
    import gguf                      # only here: fill runs where the gguf package may not be

    reader = gguf.GGUFReader(src)
    tensors = []
    for t in reader.tensors:
        name = t.tensor_type.name
        if name not in BLOCKS and name not in FLOATS:
            raise SystemExit(f"{src}: tensor {t.name} has type {name}, which this script cannot fill")
        tensors.append({"name": t.name, "type": name, "offset": int(t.data_offset),
                        "nbytes": int(t.n_bytes)})
    with open(src, "rb") as f:
        header = f.read(reader.data_offset)
    with open(dst + ".header", "wb") as f:
        f.write(header)
    with open(dst + ".json", "w") as f:
        json.dump({"source": os.path.basename(src), "data_offset": reader.data_offset,
                   "size": os.path.getsize(src), "tensors": tensors}, f)
    print(f"{dst}.header ({len(header)} bytes) and {dst}.json ({len(tensors)} tensors)")


def fill(src: str, out: str, seed: int = 0) -> None:
    """Write out from src.header and src.json: the header, then random tensor data."""
    with open(src + ".json") as f:
        plan = json.load(f)
    with open(src + ".header", "rb") as f:
        header = f.read()
    if len(header) != plan["data_offset"]:
        raise SystemExit(f"{src}.header has {len(header)} bytes, {src}.json says {plan['data_offset']}")
    rng = np.random.default_rng(seed)
    with open(out, "wb") as f:
        f.write(header)
        f.truncate(plan["size"])
    data = np.memmap(out, dtype=np.uint8, mode="r+", offset=plan["data_offset"],
                     shape=(plan["size"] - plan["data_offset"],))
    for t in plan["tensors"]:
        start = t["offset"] - plan["data_offset"]
        view = data[start:start + t["nbytes"]]
        if t["type"] in FLOATS:
            dtype = FLOATS[t["type"]]
            n = t["nbytes"] // np.dtype(dtype).itemsize
            if t["name"].endswith("norm.weight"):
                vals = np.ones(n, dtype=dtype)
            else:
                vals = (rng.standard_normal(n) * 0.02).astype(dtype)
            view[:] = vals.view(np.uint8)
            continue
        size = BLOCKS[t["type"]][0]
        if t["nbytes"] % size:
            raise SystemExit(f"{t['name']}: {t['nbytes']} bytes is no whole number of {t['type']} blocks")
        view[:] = random_blocks(t["type"], t["nbytes"] // size, rng).reshape(-1)
    data.flush()
    del data
    print(f"{out}: {plan['size']} bytes, the layout of {plan['source']}, random weights (seed {seed})")


def main() -> int:
    argv = sys.argv[1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    if argv and argv[0] in ("layout", "fill"):
        ap.add_argument("command")
    ap.add_argument("source", help="model name or GGUF path (layout, one step); "
                                   "the prefix of .header/.json (fill)")
    ap.add_argument("out", help="output GGUF (one step, fill) or prefix (layout)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    command = getattr(args, "command", None)
    if command == "fill":
        fill(args.source, args.out, args.seed)
        return 0
    from fastspec import models
    src = args.source if os.path.exists(args.source) else str(models.resolve(args.source))
    if command == "layout":
        layout(src, args.out)
        return 0
    prefix = args.out + ".layout"
    layout(src, prefix)
    fill(prefix, args.out, args.seed)
    for ext in (".header", ".json"):
        os.remove(prefix + ext)
    return 0


if __name__ == "__main__":
    sys.exit(main())
