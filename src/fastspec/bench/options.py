"""Command-line option parsers shared by the bench, ``bench sweep`` and ``bench advise``."""
from __future__ import annotations

import argparse
import math

from fastspec.config import GenerationConfig

def n_draft_arg(text: str):
    if text == "auto" or (text.isdigit() and 1 <= int(text) <= 32):
        return text if text == "auto" else int(text)
    raise argparse.ArgumentTypeError(f"must be 'auto' or an integer from 1 to 32, got {text!r}")


def list_arg(choices=None):
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items or any(choices and x not in choices for x in items):
            raise argparse.ArgumentTypeError("expected a comma-separated list"
                                             + (f" of {', '.join(choices)}" if choices else ""))
        return items
    return parse


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


def number(text: str, ok, what: str) -> float:
    """float(text) where ok(value) holds; else an argparse error saying what was wanted."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not ok(v):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return v


def fraction(text: str) -> float:
    return number(text, lambda v: 0.0 <= v <= 1.0, "a number from 0 to 1")


def top_p_arg(text: str) -> float:
    return number(text, lambda v: 0.0 < v <= 1.0, "a number above 0 and at most 1")


def temperature(text: str) -> float:
    return number(text, lambda v: v >= 0 and math.isfinite(v), "a finite number >= 0")


def seconds_arg(text: str) -> float:
    return number(text, lambda v: 0 <= v <= 3600, "a number of seconds from 0 to 3600")


def top_k_arg(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be an integer >= 0 (0 = off), got {text!r}")
    return int(text)


def draft_vocab_arg(text: str):
    if text in ("auto", "all"):
        return None if text == "all" else "auto"
    return positive(text)


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by the bench and ``bench sweep``: prompts, limits, decoder settings."""
    p.add_argument("--prompts", help="JSONL prompt file (default: the built-in set)")
    p.add_argument("--categories", type=list_arg(), help="only these categories (comma-separated)")
    p.add_argument("--limit", type=positive, help="at most N prompts per category")
    p.add_argument("--max-tokens", type=positive, default=128)
    p.add_argument("--threads", type=positive, default=None)
    p.add_argument("--n-gpu-layers", type=int, default=-1)
    p.add_argument("--ctx", type=positive, default=4096, help="context size")
    p.add_argument("--runs", type=positive, default=1, help="repeat every measurement N times")
    p.add_argument("--batch-invariant", action="store_true",
                   help="SpeculativeDecoder(batch_invariant=True): verify at most max_verify_batch tokens "
                        "at once, so greedy output is bit-identical to the target alone (slower)")
    p.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                   help="feed the prompt text as is")
    p.add_argument("--draft-vocab", type=draft_vocab_arg, default="auto",
                   help="token ids the draft model may propose: 'auto' (the leading 32768 of a "
                        "larger vocabulary), 'all', or a number (the leading N ids)")


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """The sampling filters (the bench and ``bench sweep``, which sample at a temperature > 0)."""
    off = GenerationConfig          # the filters' defaults (off), defined once
    p.add_argument("--top-k", type=top_k_arg, default=off.top_k,
                   help="when sampling (temperature > 0): keep the K most likely tokens (default 0: off)")
    p.add_argument("--top-p", type=top_p_arg, default=off.top_p,
                   help="when sampling: keep the most likely tokens whose probability reaches P (default 1: off)")
    p.add_argument("--min-p", type=fraction, default=off.min_p,
                   help="when sampling: drop tokens under P times the most likely's probability (default 0: off); "
                        "llama.cpp's defaults are --top-k 40 --top-p 0.95 --min-p 0.05 at temperature 0.8")


def add_rounds_argument(p: argparse.ArgumentParser) -> None:
    """--min-cell-seconds, for the bench and the sweep (runner.rounds_for)."""
    from fastspec.bench.runner import MAX_ROUNDS, MIN_CELL_SECONDS
    p.add_argument("--min-cell-seconds", type=seconds_arg, default=MIN_CELL_SECONDS, metavar="S",
                   help="a prompt whose first cell generates in less than S seconds (a short answer) has its "
                        f"cells measured in rounds, every cell in turn each round, up to {MAX_ROUNDS}, until the "
                        "first cell's rounds add up to S; each cell's rounds pooled (default %(default)g; 0: "
                        "each cell once)")
