#!/usr/bin/env python3
"""Does the target's own confidence say, before the draft model has read a prompt, how often
the draft will agree with it?

    python bench/target_confidence.py                      # the default pair, the built-in prompts
    python bench/target_confidence.py --tokens 64 --target A.gguf --draft B.gguf

For each prompt: the target's greedy answer (``--tokens`` long or to its end), the mean over
it of the target's probability of the token it picks (its top-1 probability: from the logits
a pass already has), and how often the draft model's greedy token after the same prefix is
that token (teacher-forced: the draft reads the target's answer, so one miss does not spoil
the rest).  Then the correlation over the prompts between the two, and between the first
``--head`` tokens' mean probability and the whole answer's agreement: what a policy could
know after a few tokens of an answer, before paying for the draft's reading of the prompt.
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

from fastspec import _core, models
from fastspec.bench.prompts import load_prompts


def answer_stats(tgt: _core.Context, drf: _core.Context, target: _core.Model, prompt: list[int],
                 n_tokens: int) -> tuple[list[float], list[bool]]:
    """(the target's top-1 probability at each greedy step, whether the draft's argmax agreed)."""
    tgt.clear()
    drf.clear()
    tgt.decode(prompt)
    drf.decode(prompt)
    probs, agree = [], []
    for _ in range(n_tokens):
        lt, ld = tgt.get_logits(), drf.get_logits()
        tok = int(np.argmax(lt))
        e = np.exp(lt - lt[tok])
        probs.append(float(1.0 / e.sum()))
        agree.append(int(np.argmax(ld[:len(lt)])) == tok)
        if target.is_eog(tok):
            break
        tgt.decode([tok])
        drf.decode([tok])
    return probs, agree


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=models.DEFAULT_PAIR[0], help="target model name or GGUF path")
    ap.add_argument("--draft", default=models.DEFAULT_PAIR[1], help="draft model name or GGUF path")
    ap.add_argument("--tokens", type=int, default=48, help="answer tokens per prompt")
    ap.add_argument("--head", type=int, default=8, help="the first tokens whose confidence is set against the whole")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.tokens < 2 or not 1 <= args.head <= args.tokens:
        ap.error("--tokens >= 2 and 1 <= --head <= --tokens")
    target = _core.Model(str(models.resolve(args.target)), n_gpu_layers=0)     # a path, or a model's name
    draft = _core.Model(str(models.resolve(args.draft)), n_gpu_layers=0)
    n_ctx = 1024
    tgt = _core.Context(target, n_ctx=n_ctx, n_threads=args.threads, flash_attn=True)
    drf = _core.Context(draft, n_ctx=n_ctx, n_threads=args.threads, flash_attn=True)
    rows = []
    try:
        for p in load_prompts(None):
            if target.chat_template() is not None:
                text = target.apply_chat_template([{"role": "user", "content": p.text}])
                prompt = target.tokenize(text, add_special=False, parse_special=True)
            else:
                prompt = target.tokenize(p.text, add_special=True)
            prompt = prompt[-(n_ctx - args.tokens - 1):]
            probs, agree = answer_stats(tgt, drf, target, prompt, args.tokens)
            head = max(1, min(args.head, len(probs)))
            rows.append((statistics.mean(probs), statistics.mean(agree), statistics.mean(probs[:head])))
            print(f"{p.id:16s} prompt {len(prompt):4d}  answer {len(probs):3d}  target top-1 p {rows[-1][0]:.3f} "
                  f"(first {head}: {rows[-1][2]:.3f})  draft agrees {rows[-1][1]:.2f}", flush=True)
    finally:
        tgt.close()
        drf.close()
        target.close()
        draft.close()
    p_all, agree, p_head = (np.array(c) for c in zip(*rows))
    if len(rows) > 2 and p_all.std() > 0 and agree.std() > 0:
        print(f"correlation over {len(rows)} prompts: mean top-1 p against agreement "
              f"{np.corrcoef(p_all, agree)[0, 1]:.3f}; the first {args.head} tokens' p against the whole "
              f"answer's agreement {np.corrcoef(p_head, agree)[0, 1]:.3f}")
    else:
        print("correlation: not defined (too few prompts, or no spread)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
