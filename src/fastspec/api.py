"""The public API: ``generate()`` and ``SpeculativeDecoder``.

A decoder holds a loaded target model and, optionally, a draft model, each with its
own context.  Every generation runs in the compiled core (``fastspec._core``) with
the GIL released; this module validates arguments and shapes results.
"""
from __future__ import annotations

import codecs
import math
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from . import _core
from .stats import GenerationStats

__all__ = ["generate", "SpeculativeDecoder", "GenerationResult", "StreamPiece", "SOURCE_NAMES"]

SOURCE_NAMES = ("target", "draft", "lookup")
_PROBE_TEXT = "def mean(xs):\n    return sum(xs) / len(xs)  # the average of a list of numbers"
MAX_DRAFT = 32
AUTO_DRAFT_MAX = 16


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    finish_reason: str
    stats: GenerationStats
    sources: list[str] = field(repr=False, default_factory=list)

    def __str__(self) -> str:
        return self.text


@dataclass
class StreamPiece:
    """A chunk of streamed output: the text it adds, and for each of its tokens where it
    came from ('draft' or 'lookup' for an accepted proposal, 'target' for the target's own)."""
    text: str
    tokens: list[int]
    sources: list[str]


def _validate_sampling(temperature, top_k, top_p, min_p):
    if not isinstance(temperature, (int, float)) or math.isnan(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if math.isinf(temperature):
        raise ValueError("temperature must be finite")
    if not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
    if not isinstance(top_p, (int, float)) or not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(min_p, (int, float)) or not (0.0 <= min_p <= 1.0):
        raise ValueError(f"min_p must be in [0, 1], got {min_p!r}")


def _validate_draft(n_draft, n_draft_min, p_min):
    if n_draft == "auto":
        pass
    elif isinstance(n_draft, bool) or not isinstance(n_draft, int):
        raise ValueError(f"n_draft must be an integer or 'auto', got {n_draft!r}")
    elif not (1 <= n_draft <= MAX_DRAFT):
        raise ValueError(f"n_draft must be between 1 and {MAX_DRAFT}, got {n_draft}")
    if not isinstance(n_draft_min, int) or n_draft_min < 0:
        raise ValueError(f"n_draft_min must be an integer >= 0, got {n_draft_min!r}")
    if not isinstance(p_min, (int, float)) or not (0.0 <= p_min <= 1.0):
        raise ValueError(f"p_min must be in [0, 1], got {p_min!r}")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class SpeculativeDecoder:
    """A loaded target model (and optional draft model) ready to generate.

    ``target`` and ``draft`` are GGUF paths or names from ``fastspec.models``.  With no
    draft, ``generate()`` runs the target alone (or n-gram lookup with ``lookup=True``).
    ``batch_invariant=True`` turns flash attention on and, at load, measures the largest
    verification batch whose logits are bit-identical to one-token decodes on this
    build and CPU; no larger batch is ever verified.  Speculative greedy output is
    then token-identical to target-alone output, bit for bit (it costs some speed;
    see README).  In the default (fast) mode, larger batches run ggml's faster
    batched kernels, whose float sums differ slightly, so a greedy choice between
    two near-tied tokens can flip.
    """

    def __init__(self, target, draft=None, *, n_ctx: int = 4096, n_threads: int | None = None,
                 n_gpu_layers: int = -1, n_batch: int = 512, flash_attn: bool | None = None,
                 batch_invariant: bool = False, check_vocab: bool = True, download: bool = True):
        from .models import resolve

        self._lock = threading.Lock()
        self._target_ctx = self._draft_ctx = None
        self.target_model = self.draft_model = None
        target_path = str(resolve(target, download=download))
        draft_path = str(resolve(draft, download=download)) if draft is not None else None
        if batch_invariant:
            flash_attn = True
        repack = True
        self.batch_invariant = batch_invariant
        self.max_verify_batch = 0
        # measured costs of this pair on this machine, kept across generations; the first
        # adaptive speculative generation also times each verification batch size once
        self.cost_model = _core.CostModel()
        self.target_model = _core.Model(target_path, n_gpu_layers=n_gpu_layers, repack=repack)
        self._target_ctx = _core.Context(self.target_model, n_ctx=n_ctx, n_batch=n_batch,
                                         n_threads=n_threads, flash_attn=flash_attn)
        if draft_path is not None:
            if _same_file(draft_path, target_path):
                warnings.warn("the draft model is the target model itself: every draft is accepted, "
                              "but drafting costs as much as verifying, so this cannot be faster than "
                              "the target alone", RuntimeWarning, stacklevel=2)
            self.draft_model = _core.Model(draft_path, n_gpu_layers=n_gpu_layers, repack=repack)
            if check_vocab:
                diffs = self.target_model.vocab_differences(self.draft_model)
                if diffs:
                    self.close()
                    raise ValueError("the draft model cannot draft for this target: its vocabulary differs:\n  "
                                     + "\n  ".join(diffs))
            for m, role in ((self.target_model, "target"), (self.draft_model, "draft")):
                if m.is_recurrent:
                    self.close()
                    raise ValueError(f"the {role} model is recurrent/hybrid: its state cannot drop rejected "
                                     "tokens, so it cannot be used for speculative decoding (use it alone)")
            self._draft_ctx = _core.Context(self.draft_model, n_ctx=n_ctx, n_batch=n_batch,
                                            n_threads=n_threads, flash_attn=flash_attn)
        if batch_invariant:
            self.max_verify_batch = self._largest_invariant_batch()

    def _largest_invariant_batch(self, k: int = 8) -> int:
        """Largest N <= k such that decoding N tokens at once gives bit-identical logits
        to decoding them one at a time (so batches up to N are batch-invariant)."""
        ctx = self._target_ctx
        toks = self.target_model.tokenize(_PROBE_TEXT, add_special=False)
        while len(toks) < k + 4:
            toks = toks + toks
        head, tail = toks[:4], toks[4:4 + k]
        try:
            ctx.clear()
            ctx.decode(head)
            singles = []
            for t in tail:
                ctx.decode([t])
                singles.append(ctx.get_logits())
            best = 1
            for n in range(2, k + 1):
                ctx.remove_from(len(head))
                ctx.decode(tail[:n], logits="all")
                if not all((ctx.get_logits(i) == singles[i]).all() for i in range(n)):
                    break
                best = n
        finally:
            ctx.clear()
        if best == 1:
            warnings.warn("no batch-invariant verification batch exists with this build: "
                          "batch_invariant=True runs the target alone", RuntimeWarning, stacklevel=3)
        return best

    # -- lifetime -----------------------------------------------------------
    def close(self) -> None:
        """Free both models and contexts.  Safe to call twice."""
        for obj in (self._draft_ctx, self._target_ctx, self.draft_model, self.target_model):
            if obj is not None:
                obj.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def n_ctx(self) -> int:
        return self._target_ctx.n_ctx

    # -- text helpers -------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self.target_model.tokenize(text, add_special=add_special, parse_special=True)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.target_model.detokenize(list(tokens))

    def _prompt_tokens(self, prompt, add_special: bool) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty")
            toks = self.tokenize(prompt, add_special=add_special)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            toks = list(prompt)
        else:
            raise TypeError("prompt must be a string or a list of token ids")
        if not toks:
            raise ValueError("the prompt is empty (it tokenizes to no tokens)")
        return toks

    # -- generation ---------------------------------------------------------
    def _generator(self, *, max_tokens, temperature, top_k, top_p, min_p, seed, stop,
                   n_draft, n_draft_min, p_min, lookup, speculative, ngram_min=2, ngram_max=8):
        if self.target_model is None or self.target_model.closed:
            raise RuntimeError("this decoder is closed")
        _validate_sampling(temperature, top_k, top_p, min_p)
        _validate_draft(n_draft, n_draft_min, p_min)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        stop_bytes = [s.encode("utf-8") for s in stop if s]
        use_draft = speculative and self._draft_ctx is not None
        if self.batch_invariant and self.max_verify_batch <= 1:
            use_draft = lookup = False
        adaptive = n_draft == "auto"
        nd = AUTO_DRAFT_MAX if adaptive else n_draft
        gen = _core.Generator(
            self._target_ctx, self._draft_ctx if use_draft else None,
            temperature=float(temperature), top_k=top_k, top_p=float(top_p), min_p=float(min_p),
            seed=seed, n_draft=nd, n_draft_min=min(n_draft_min, nd), p_min=float(p_min),
            adaptive=adaptive, max_tokens=max_tokens, stop=stop_bytes, lookup=bool(lookup) and speculative,
            max_verify=self.max_verify_batch, ngram_min=ngram_min, ngram_max=ngram_max,
            cost=self.cost_model)
        return gen, adaptive and (use_draft or bool(lookup and speculative))

    def _start(self, gen, calibrate: bool, toks) -> None:
        """Prefill; on the first adaptive speculative run, time the verification batch
        sizes (about 2 s on a 2-core CPU with a 1.5B target; reported as t_calibrate,
        outside tokens/s)."""
        gen.start(toks)
        if calibrate and not self.cost_model.calibrated:
            gen.calibrate()

    def _acquire(self):
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this SpeculativeDecoder is already generating in another thread; "
                               "use one decoder per thread")

    def generate(self, prompt, *, max_tokens: int = 256, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0, seed: int | None = None,
                 stop: str | Sequence[str] | None = None, n_draft: int | str = "auto",
                 n_draft_min: int = 0, p_min: float = 0.0, lookup: bool = False,
                 ngram_min: int = 2, ngram_max: int = 8,
                 speculative: bool = True, add_special: bool = True) -> GenerationResult:
        """Generate a completion of ``prompt`` (a string or token ids).

        Greedy at ``temperature=0`` (the default); otherwise sampled with temperature,
        then top-k, top-p and min-p, with ``seed`` for reproducibility.  ``n_draft`` is
        the number of tokens drafted per target pass, or ``"auto"`` to choose it each
        pass from measured costs and acceptance.  ``lookup=True`` adds n-gram proposals:
        the tokens that followed the latest earlier occurrence of the longest suffix of
        ``ngram_max`` down to ``ngram_min`` tokens.  ``speculative=False`` runs the
        target alone (the baseline).  Ctrl-C stops between two target passes; the
        decoder stays usable.
        """
        self._acquire()
        try:
            toks = self._prompt_tokens(prompt, add_special)
            gen, calibrate = self._generator(max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                                  top_p=top_p, min_p=min_p, seed=seed, stop=stop, n_draft=n_draft,
                                  n_draft_min=n_draft_min, p_min=p_min, lookup=lookup,
                                  speculative=speculative, ngram_min=ngram_min, ngram_max=ngram_max)
            self._start(gen, calibrate, toks)
            gen.run()
            return self._result(gen)
        finally:
            self._lock.release()

    def _result(self, gen) -> GenerationResult:
        text = gen.text_bytes.decode("utf-8", "replace")
        return GenerationResult(text=text, tokens=gen.tokens, finish_reason=gen.finish_reason,
                                stats=GenerationStats.from_core(gen.stats()),
                                sources=[SOURCE_NAMES[s] for s in gen.sources])

    def stream(self, prompt, **kwargs) -> Iterator[StreamPiece]:
        """Like ``generate()``, but yields ``StreamPiece``s as target passes complete."""
        add_special = kwargs.pop("add_special", True)
        defaults = dict(max_tokens=256, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=None,
                        stop=None, n_draft="auto", n_draft_min=0, p_min=0.0, lookup=False, speculative=True,
                        ngram_min=2, ngram_max=8)
        unknown = set(kwargs) - set(defaults)
        if unknown:
            raise TypeError(f"unexpected arguments: {', '.join(sorted(unknown))}")
        defaults.update(kwargs)
        self._acquire()
        try:
            toks = self._prompt_tokens(prompt, add_special)
            gen, calibrate = self._generator(**defaults)
            self._start(gen, calibrate, toks)
        except BaseException:
            self._lock.release()
            raise
        return self._stream(gen)

    def _stream(self, gen) -> Iterator[StreamPiece]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        sent = 0
        try:
            while gen.finish_reason is None:
                tokens, sources = gen.step()
                safe = gen.safe_text_len
                chunk = gen.text_bytes[sent:safe] if safe > sent else b""
                sent = max(sent, safe)
                text = decoder.decode(chunk, final=gen.finish_reason is not None)
                if tokens or text:
                    yield StreamPiece(text, tokens, [SOURCE_NAMES[s] for s in sources])
            self.last_result = self._result(gen)     # text/tokens/stats of the finished stream
        finally:
            self._lock.release()

    def chat(self, messages: Sequence[dict], **kwargs) -> GenerationResult:
        """Generate the assistant's reply to ``messages`` with the target's chat template."""
        prompt = self.target_model.apply_chat_template(list(messages), add_assistant=True)
        return self.generate(prompt, add_special=False, **kwargs)


def generate(prompt, *, target, draft=None, n_ctx: int = 4096, n_threads: int | None = None,
             n_gpu_layers: int = -1, **kwargs) -> GenerationResult:
    """One-shot generation: load ``target`` (and ``draft``), generate, free them.

    To generate more than once, keep a ``SpeculativeDecoder``: loading models takes
    seconds.  Keyword arguments are those of ``SpeculativeDecoder.generate``.
    """
    with SpeculativeDecoder(target, draft, n_ctx=n_ctx, n_threads=n_threads,
                            n_gpu_layers=n_gpu_layers) as dec:
        return dec.generate(prompt, **kwargs)
