#!/usr/bin/env python3
"""fastspec beside the Python libraries its users would otherwise run, each on its own ground,
greedy, the same model files, prompts (as token ids) and thread count:

* llama-cpp-python (``--lcp-python``): its plain generation and its prompt lookup
  (``LlamaPromptLookupDecoding``, the only speculative mode it has), at ``num_pred_tokens``
  10 (its default) and 2 (its documentation's advice for CPUs);
* Hugging Face transformers (``--hf-python``): ``generate`` alone, with
  ``prompt_lookup_num_tokens=10`` and with ``assistant_model`` (the draft), the GGUF files
  loaded by transformers itself (dequantized, ``--hf-dtype`` bfloat16 by default: on CPUs
  with AVX-512 BF16 it ran twice float32's speed).

Each library runs in an interpreter and a worker process of its own (``--lcp-python``,
``--hf-python``: a venv with it installed; llama-cpp-python's stock llama.cpp and fastspec's
patched one are never loaded into one process), e.g.::

    python3 -m venv /tmp/lcp && CMAKE_ARGS="-DLLAVA_BUILD=OFF" \\
        /tmp/lcp/bin/pip install llama-cpp-python==0.3.36
    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers accelerate gguf
    python bench/compare_peers.py --lcp-python /tmp/lcp/bin/python --hf-python /tmp/hf/bin/python

(0.3.36 is the release whose sdist carries the llama.cpp commit fastspec vendors; on Linux it
builds for the installing CPU, as fastspec does.)  Each worker keeps its models loaded (one
``Llama`` per setting; one fastspec decoder per model set, as a user keeps one); the driver
hands them the same prompt token ids (the built-in bench prompts in the target's chat
template), prompt by prompt, the sides taking turns in an alternating order so that the
machine's pace hits all alike.  A short warm-up generation per setting comes first.

What is timed, the same way on every side and from outside the library: the wall time from
the first generated token's arrival to the last's, over the tokens after the first (the
prompt's processing is left out: it is not what anyone speculates on).  All stop at the first
end-of-generation token (not counted) or at ``--max-tokens``.  Each side's speculative
outputs are checked against its own target alone (greedy: they should be the same), and
each peer's target alone against fastspec's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# Every worker: argv[1] a JSON config; JSON lines in ({"setting", "tokens", "max_tokens"}),
# JSON lines out ({"tokens", "t_first", "t_last", "n_first"}: perf_counter seconds at the
# first and the last generated token's arrival, and how many came with the first).

LCP_WORKER = r"""
import json, sys, time
from llama_cpp import Llama, llama_vocab_is_eog
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
cfg = json.loads(sys.argv[1])
llms = {}
def get(setting):
    if setting not in llms:
        draft = None
        if setting != "target":
            draft = LlamaPromptLookupDecoding(num_pred_tokens=int(setting.split("-")[1]))
        llms[setting] = Llama(model_path=cfg["target"], n_ctx=cfg["n_ctx"], n_threads=cfg["threads"],
                              n_threads_batch=cfg["threads"], draft_model=draft, verbose=False)
    return llms[setting]
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    llm = get(req["setting"])
    llm.reset()
    out, stamps = [], []
    for tok in llm.generate(req["tokens"], temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        stamps.append(time.perf_counter())
        if llama_vocab_is_eog(llm._model.vocab, tok):
            break
        out.append(int(tok))
        if len(out) >= req["max_tokens"]:
            break
    print(json.dumps({"tokens": out, "t_first": stamps[0], "t_last": stamps[max(len(out) - 1, 0)],
                      "n_first": 1}), flush=True)
"""

HF_WORKER = r"""
import json, os, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.streamers import BaseStreamer
cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
dtype = getattr(torch, cfg["hf_dtype"])
def load(path):
    d, f = os.path.dirname(path), os.path.basename(path)
    return AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=dtype).eval()
target = load(cfg["target"])
assistant = load(cfg["draft"]) if cfg.get("draft") else None
eos = set(cfg["eog"])           # every end-of-generation id the GGUF's vocabulary has, as llama.cpp stops at
class Clock(BaseStreamer):
    def __init__(self):
        self.seen_prompt, self.marks = False, []
    def put(self, value):
        if not self.seen_prompt:          # the first call hands over the prompt
            self.seen_prompt = True
            return
        self.marks.append((time.perf_counter(), int(value.numel())))
    def end(self):
        pass
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    kw = {}
    if req["setting"].startswith("lookup-"):
        kw["prompt_lookup_num_tokens"] = int(req["setting"].split("-")[1])
    elif req["setting"] == "assistant":
        kw["assistant_model"] = assistant
    ids = torch.tensor([req["tokens"]])
    clock = Clock()
    with torch.inference_mode():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=req["max_tokens"],
                              do_sample=False, streamer=clock, eos_token_id=sorted(eos), pad_token_id=min(eos),
                              **kw)
    gen = [int(t) for t in out[0, ids.shape[1]:]]
    cut = next((i for i, t in enumerate(gen) if t in eos), len(gen))
    gen = gen[:cut]
    # the arrival of the last kept token: the first mark whose running count covers it
    t_last, seen = clock.marks[-1][0], 0
    for t, n in clock.marks:
        seen += n
        if seen >= len(gen):
            t_last = t
            break
    print(json.dumps({"tokens": gen, "t_first": clock.marks[0][0], "t_last": t_last,
                      "n_first": min(clock.marks[0][1], len(gen))}), flush=True)
"""

FASTSPEC_WORKER = r"""
import json, sys, time
import fastspec
cfg = json.loads(sys.argv[1])
alone = fastspec.SpeculativeDecoder(cfg["target"], None, n_ctx=cfg["n_ctx"], n_threads=cfg["threads"],
                                   cost_cache=False)
paired = (fastspec.SpeculativeDecoder(cfg["target"], cfg["draft"], n_ctx=cfg["n_ctx"], n_threads=cfg["threads"],
                                     cost_cache=False)
          if cfg.get("draft") else None)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    setting = req["setting"]
    dec = paired if setting == "draft" else alone
    kw = dict(speculative=False) if setting == "target" else dict(lookup=(setting == "lookup"))
    out, t_first, n_first, t_last = [], None, 0, None
    for piece in dec.stream(req["tokens"], max_tokens=req["max_tokens"], add_special=False, **kw):
        now = time.perf_counter()
        if not piece.tokens:
            continue
        out += list(piece.tokens)
        if t_first is None:
            t_first, n_first = now, len(piece.tokens)
        t_last = now
    print(json.dumps({"tokens": out, "t_first": t_first, "t_last": t_last, "n_first": n_first}), flush=True)
"""


class Worker:
    """A worker process speaking the JSON-lines protocol above."""

    def __init__(self, name: str, python: str, code: str, cfg: dict):
        self.name = name
        self.proc = subprocess.Popen([python, "-c", code, json.dumps(cfg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        if not ready:
            self.proc.wait(timeout=60)
            raise SystemExit(f"error: the {name} worker did not start ({python}; its error above)")

    def run(self, setting: str, tokens: list[int], max_tokens: int) -> dict:
        self.proc.stdin.write(json.dumps({"setting": setting, "tokens": tokens, "max_tokens": max_tokens}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"error: the {self.name} worker stopped (setting {setting})")
        r = json.loads(line)
        n_after = len(r["tokens"]) - r["n_first"]
        secs = (r["t_last"] - r["t_first"]) if r["t_first"] is not None else 0.0
        r["tok_s"] = n_after / secs if n_after > 0 and secs > 0 else float("nan")
        return r

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# fastspec's mode that answers each peer setting
FASTSPEC_MODE = {"lookup-2": "lookup", "lookup-10": "lookup", "assistant": "draft"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lcp-python", default=None, help="an interpreter with llama-cpp-python installed")
    ap.add_argument("--hf-python", default=None, help="an interpreter with torch, transformers, accelerate, gguf")
    ap.add_argument("--target", default=None, help="GGUF path or fastspec model name (default: the default target)")
    ap.add_argument("--draft", default=None, help="the draft for transformers' assistant_model and fastspec's draft "
                                                  "mode (default: the default draft)")
    ap.add_argument("--hf-dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=1, help="times each prompt is run per setting and side")
    ap.add_argument("--categories", default=None, help="only these built-in categories (comma-separated)")
    ap.add_argument("--limit", type=int, default=None, help="at most N prompts per category")
    ap.add_argument("--out", default=None, help="write every measurement here (JSON)")
    args = ap.parse_args()
    if not (args.lcp_python or args.hf_python):
        ap.error("name at least one peer: --lcp-python and/or --hf-python")

    import fastspec
    from fastspec import models
    from fastspec.bench.prompts import load_prompts, select_prompts
    from fastspec.bench.report import geomean

    def path_of(name):
        return name if os.path.exists(name) else str(models.resolve(name))

    target = path_of(args.target or models.DEFAULT_PAIR[0])
    draft = path_of(args.draft or models.DEFAULT_PAIR[1]) if args.hf_python else None
    model = fastspec._core.Model(target)
    prompts = select_prompts(load_prompts(None), args.categories.split(",") if args.categories else None, args.limit)
    toks = {p.id: model.tokenize(model.apply_chat_template([{"role": "user", "content": p.text}], add_assistant=True),
                                 add_special=False, parse_special=True)
            for p in prompts}
    eog = list(model.eog_tokens)
    model.close()

    cfg = dict(target=target, draft=draft, n_ctx=args.ctx, threads=args.threads, hf_dtype=args.hf_dtype, eog=eog)
    # side -> (python, worker code, its settings)
    plan = {"fastspec": (sys.executable, FASTSPEC_WORKER, ["target", "lookup"] + (["draft"] if draft else []))}
    if args.lcp_python:
        plan["llama-cpp-python"] = (args.lcp_python, LCP_WORKER, ["target", "lookup-10", "lookup-2"])
    if args.hf_python:
        plan["transformers"] = (args.hf_python, HF_WORKER, ["target", "lookup-10", "assistant"])
    workers = {}
    rows = []
    try:
        for side, (python, code, _) in plan.items():
            workers[side] = Worker(side, python, code, cfg)
        runs = [(side, s) for side, (_, _, settings) in plan.items() for s in settings]
        for side, s in runs:      # warm-up, not kept
            workers[side].run(s, toks[prompts[0].id], 8)
        for rnd in range(args.rounds):
            for i, p in enumerate(prompts):
                order = runs if (rnd + i) % 2 == 0 else runs[::-1]     # no side always first
                for side, setting in order:
                    r = workers[side].run(setting, toks[p.id], args.max_tokens)
                    rows.append(dict(prompt=p.id, category=p.category, round=rnd, side=side, setting=setting,
                                     tok_s=r["tok_s"], n_tokens=len(r["tokens"]), tokens=r["tokens"]))
                    print(f"{p.id:18s} {side:17s} {setting:10s} {r['tok_s']:6.1f} tok/s  {len(r['tokens'])} tokens",
                          flush=True)
    finally:
        for w in workers.values():
            w.close()

    def cell(side, setting, category=None):
        return [r for r in rows if r["side"] == side and r["setting"] == setting
                and (category is None or r["category"] == category)]

    def ratio(a, b):
        """Geometric mean over prompts and rounds of a's tok/s over b's, paired."""
        pb = {(r["prompt"], r["round"]): r["tok_s"] for r in b}
        g = geomean([r["tok_s"] / pb[(r["prompt"], r["round"])] for r in a if (r["prompt"], r["round"]) in pb])
        return float("nan") if g is None else g

    def same(a, b):
        tb = {(r["prompt"], r["round"]): r["tokens"] for r in b}
        return sum(1 for r in a if tb.get((r["prompt"], r["round"])) == r["tokens"])

    med = lambda c: statistics.median(r["tok_s"] for r in c)
    print()
    print(f"{len(prompts)} prompts x {args.rounds} round(s), max {args.max_tokens} tokens, {args.threads} threads, "
          f"{os.path.basename(target)}" + (f" + {os.path.basename(draft)}" if draft else "")
          + "; tok/s after the first token; ratios are geometric means of paired ratios")
    fs_t = cell("fastspec", "target")
    for mode in plan["fastspec"][2][1:]:
        c = cell("fastspec", mode)
        print(f"fastspec {mode}: {ratio(c, fs_t):.3f}x its target alone ({med(fs_t):.1f} tok/s); "
              f"its tokens the same on {same(c, fs_t)}/{len(c)}")
    cats = sorted({r["category"] for r in rows})
    for side in plan:
        if side == "fastspec":
            continue
        pt = cell(side, "target")
        print(f"{side} target alone {med(pt):.1f} tok/s: fastspec's {ratio(fs_t, pt):.3f}x it "
              f"(the same tokens on {same(pt, fs_t)}/{len(pt)})")
        for s in plan[side][2][1:]:
            c, fm = cell(side, s), FASTSPEC_MODE[s]
            print(f"  {side} {s}: {ratio(c, pt):.3f}x its target alone (its tokens the same on "
                  f"{same(c, pt)}/{len(c)}); fastspec {fm} {ratio(cell('fastspec', fm), c):.3f}x it")
            print("    by category, fastspec / it (its own speed-up): " + ", ".join(
                f"{cat} {ratio(cell('fastspec', fm, cat), cell(side, s, cat)):.2f}x "
                f"({ratio(cell(side, s, cat), cell(side, 'target', cat)):.2f}x)" for cat in cats))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(dict(args=vars(args), rows=rows), fh)
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
