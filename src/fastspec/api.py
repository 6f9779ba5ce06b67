"""The public API: ``generate()`` and ``SpeculativeDecoder``.

A decoder holds a loaded target model and, optionally, a draft model, each with its
own context.  Every generation runs in the compiled core (``fastspec._core``) with
the GIL released; this module validates arguments and shapes results.
"""
from __future__ import annotations

import codecs
import os
import re
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from . import _core
from . import cost_cache as _cost_cache
from .config import AUTO_DRAFT_MAX, MAX_DRAFT, GenerationConfig
from .stats import GenerationStats

__all__ = ["generate", "SpeculativeDecoder", "GenerationResult", "StreamPiece", "SOURCE_NAMES",
           "GenerationConfig"]

SOURCE_NAMES = _core.SOURCE_NAMES
_PROBE_TEXT = "def mean(xs):\n    return sum(xs) / len(xs)  # the average of a list of numbers"


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


def _head_size(model) -> int:
    """Values per attention head (keys and values alike; 0 where they differ or are not known)."""
    meta = model.metadata
    arch = meta.get("general.architecture", "")
    try:
        n_head = int(meta.get(f"{arch}.attention.head_count", 0))
        k = int(meta.get(f"{arch}.attention.key_length", 0)) or (model.n_embd // n_head if n_head else 0)
        v = int(meta.get(f"{arch}.attention.value_length", 0)) or k
    except (TypeError, ValueError):       # a per-layer list, say
        return 0
    return k if k == v else 0


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


DRAFT_VOCAB_AUTO = 32768   # draft_vocab="auto": ids the draft may propose, of a larger vocabulary


def _draft_vocab(setting, model, discrete_gpu: bool = False) -> int | None:
    """The leading token ids the draft model computes logits for (None: all).  ``"auto"``
    with the draft's layers on a discrete GPU (its own memory: CUDA and the like, not
    Apple's unified memory) is all of them: there the output matmul is not what a draft
    token costs (on an H100 one token of the default draft took 1.06 ms with every logit,
    1.00 ms with the leading 32768), while each id beyond them that the sequence brings
    rebuilds the extra rows, one copy across the bus a row (3.1-3.5 ms a time)."""
    if setting == "auto" and discrete_gpu:
        return None
    if setting == "auto":
        # byte-pair vocabularies number tokens roughly by frequency: for a large vocabulary
        # the leading ids cover most text, and the output matmul shrinks with them
        return DRAFT_VOCAB_AUTO if model.n_vocab >= 2 * DRAFT_VOCAB_AUTO else None
    if setting is None:
        return None
    if isinstance(setting, bool) or not isinstance(setting, int):
        raise TypeError(f"must be 'auto', None or an integer, got {setting!r}")
    return setting


# Markup that chat models' answers often use (a code fence, LaTeX commands) and whose tokens a
# trimmed draft vocabulary may lack: hinted to the draft from a generation's start (_draft_hints)
DRAFT_HINT_TEXT = ("```", "```bash", "\\frac", "\\(", "\\)", "\\[", "\\]", "\\times", "\\cdot",
                   "\\sqrt", "\\text", "\\left", "\\right", "\\boxed")
DRAFT_HINT_WORDS = 400          # a prompt's distinct words whose other forms are hinted
_WORD = re.compile(r"\w+")
_WORD_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")


def _word_forms(text: str, max_words: int = DRAFT_HINT_WORDS) -> list[str]:
    """The forms an answer may write a prompt's words in: each word and its parts
    (snake_case and camelCase pieces) as written, in lower case and capitalised, alone and
    after a space (the first ``max_words`` distinct words and parts)."""
    parts = (p for w in _WORD.findall(text) for p in (w, *w.split("_"), *_WORD_PART.findall(w)))
    words: dict[str, None] = {}
    for p in parts:
        if len(words) >= max_words:
            break
        if len(p) >= 2:
            words[p] = None
    forms = dict.fromkeys(f for w in words for v in (w, w.lower(), w.capitalize()) for f in (v, " " + v))
    return list(forms)


class SpeculativeDecoder:
    """A loaded target model (and optional draft model) ready to generate.

    ``target`` and ``draft`` are GGUF paths or names from ``fastspec.models``.  With no
    draft, ``generate()`` runs the target alone (or n-gram lookup with ``lookup=True``).
    On a CPU-only build with fastspec's ggml patches (the default build), no verification
    batch is larger than ``fastspec._core.invariant_rows()`` (16) tokens: the patches make
    such batches compute every row exactly as a one-token decode does, so greedy output
    equals the target alone's.  ``batch_invariant=True`` turns flash attention on and, at
    load, measures the largest verification batch whose logits are bit-identical to
    one-token decodes on this build and CPU; no larger batch is ever verified (a
    guarantee that holds without the patches too, at some speed; see README).  With the
    target's layers on a CUDA GPU the same holds for batches of up to
    ``fastspec._core.cuda_invariant_rows()`` (16) tokens, flash attention on (the default
    there, patches 0022-0024; attention heads of 64, 128 or 256 values); on other GPU
    backends (Metal) batches run the backend's batched kernels, whose float sums can differ
    slightly, so a greedy choice between two near-tied tokens can flip.

    ``draft_vocab``: the token ids the draft model computes logits for: ``"auto"`` (the
    leading 32768 of a vocabulary at least twice that size, plus the ids beyond them that
    the sequence uses and the end-of-generation tokens; all of them where the draft's
    layers are on a discrete GPU), ``None`` (all), or an integer
    (that many leading ids, plus the same extras).  A smaller output matmul makes each draft
    token cheaper; the target is untouched, so output does not change.
    ``decoder.draft_vocab`` is the leading count in effect.

    ``target`` and ``draft`` may also be loaded ``fastspec._core.Model`` objects (another
    decoder's ``target_model``, say): the decoder then shares their weights (each decoder has
    its own contexts), does not close them, and ``n_gpu_layers`` / ``use_mmap`` do not apply
    to them; close the decoders that share a model before the one that loaded it.

    ``use_mmap``: ``None`` (the default) reads models the CPU runs on Linux into memory of
    their own, in huge pages where the kernel grants them (one-token passes faster; loading a
    little slower, the weights not shared with other processes), and maps them elsewhere;
    ``True`` always maps the files, ``False`` always reads them in
    (``decoder.target_model.use_mmap`` says which).

    ``cost_cache``: the first adaptive speculative generation times the target's
    verification sizes and the draft's tokens (2-4 s on a 2-core CPU); with ``True`` (the
    default) what it found is kept on disk (``fastspec.cost_cache``: ``costs.json`` in the
    model cache, or ``$FASTSPEC_COST_CACHE``; ``0`` there turns it off), and a later
    decoder of the same pair and settings on the same machine and build starts from it
    instead of timing again (``decoder.costs_restored``; ``stats.t_calibrate`` is then 0).
    ``False``: always time; a path: keep them in that file.
    """

    def __init__(self, target, draft=None, *, n_ctx: int = 4096, n_threads: int | None = None,
                 n_gpu_layers: int = -1, n_batch: int = 512, flash_attn: bool | None = None,
                 batch_invariant: bool = False, check_vocab: bool = True, download: bool = True,
                 corpus=False, corpus_max_tokens: int | None = None, draft_vocab="auto",
                 use_mmap: bool | None = None, cost_cache=True):
        from .models import resolve

        self._cost_cache = _cost_cache.resolve(cost_cache)
        self.costs_restored = False       # the costs came from the cost cache, not timed here
        self._cost_key = None             # (_costs_key: made once, on first use)
        self._lock = threading.Lock()
        self._target_ctx = self._draft_ctx = None
        self.corpus = None
        self._suffix_proposer = None
        self.target_model = self.draft_model = None
        # a loaded Model is shared (another decoder's, say): used as it is, never closed here
        self._owned = []
        target_path = target.path if isinstance(target, _core.Model) else str(resolve(target, download=download))
        draft_path = (None if draft is None else draft.path if isinstance(draft, _core.Model)
                      else str(resolve(draft, download=download)))
        if batch_invariant:
            flash_attn = True
        repack = True
        self.batch_invariant = batch_invariant
        self.max_verify_batch = 0
        self.draft_vocab = 0
        # measured costs of this pair on this machine, kept across generations; the first
        # adaptive speculative generation also times each verification batch size once
        self.cost_model = _core.CostModel()
        # acceptance per proposer, kept across generations (the policy's evidence)
        self.acceptance = _core.AcceptanceModel()
        self.target_model = self._model(target, target_path, n_gpu_layers, repack, use_mmap)
        # on a CUDA build with the patches, verification batches of up to this many tokens are
        # exact with flash attention (its vector kernel, patch 0023): on unless turned off
        # (the vector kernel takes heads of 64, 128 or 256 values; others take ggml's kernels)
        cuda_rows = (_core.cuda_invariant_rows()
                     if self.target_model.on_gpu and _head_size(self.target_model) in (64, 128, 256) else 0)
        if cuda_rows >= 2 and flash_attn is None:
            flash_attn = True
        self._target_ctx = _core.Context(self.target_model, n_ctx=n_ctx, n_batch=n_batch,
                                         n_threads=n_threads, flash_attn=flash_attn)
        self._flash_attn, self._n_batch = flash_attn, n_batch     # (the cost cache's key)
        if draft_path is not None:
            if _same_file(draft_path, target_path):
                warnings.warn("the draft model is the target model itself: every draft is accepted, "
                              "but drafting costs as much as verifying, so this cannot be faster than "
                              "the target alone", RuntimeWarning, stacklevel=2)
            self.draft_model = self._model(draft, draft_path, n_gpu_layers, repack, use_mmap)
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
            try:
                self.draft_vocab = self._draft_ctx.set_n_logits(_draft_vocab(
                    draft_vocab, self.draft_model, self.draft_model.on_gpu and sys.platform != "darwin"))
            except (TypeError, ValueError) as e:
                self.close()
                raise type(e)(f"draft_vocab: {e}") from None
        # the patched kernels are exact up to this many rows: verify no more at once (the
        # CPU's, or with the target's layers on a GPU, CUDA's; none known on other GPUs)
        rows = _core.invariant_rows()
        if self.target_model.on_gpu:
            rows = min(rows, cuda_rows) if flash_attn else 0
        rows = min(rows, _core.DRAFT_LIMIT + 1)
        if batch_invariant:
            # measured, up to what the patches promise (8 where they promise nothing)
            self.max_verify_batch = self._largest_invariant_batch(max(8, rows))
        elif rows >= 2:
            self.max_verify_batch = rows
        if corpus is not False and corpus is not None:
            try:
                self._open_corpus(corpus, corpus_max_tokens)
            except BaseException:
                self.close()
                raise

    def _open_corpus(self, corpus, max_tokens) -> None:
        """``corpus=True``: an empty suffix corpus; a path: one saved earlier with
        ``decoder.corpus.save(path)`` for this target's vocabulary."""
        from .corpus import DEFAULT_MAX_TOKENS, SuffixCorpus

        kw = {"max_tokens": DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens}
        if corpus is True:
            self.corpus = SuffixCorpus(self.target_model, **kw)
        elif isinstance(corpus, (str, os.PathLike)):
            self.corpus = SuffixCorpus.load(corpus, self.target_model, **kw)
        else:
            raise TypeError(f"corpus must be True, False or the path of a saved corpus, got {corpus!r}")

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
    def _model(self, given, path: str, n_gpu_layers: int, repack: bool, use_mmap) -> "_core.Model":
        if isinstance(given, _core.Model):
            if given.closed:
                raise ValueError(f"the Model given for {path!r} is closed")
            return given
        m = _core.Model(path, n_gpu_layers=n_gpu_layers, repack=repack, use_mmap=use_mmap)
        self._owned.append(m)
        return m

    def close(self) -> None:
        """Free the contexts and the models this decoder loaded (not those it was given).
        Safe to call twice."""
        for obj in (self._draft_ctx, self._target_ctx, *getattr(self, "_owned", ())):
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
    def _check_open(self) -> None:
        if self.target_model is None or self.target_model.closed:
            raise RuntimeError("this decoder is closed")

    def _checked_prompt(self, prompt, add_special: bool) -> list[int]:
        """Prompt tokens, checked against the vocabulary and the context (so that bad
        input raises where the call is made, before any generation starts)."""
        toks = self._prompt_tokens(prompt, add_special)
        n_vocab = self.target_model.n_vocab
        bad = next((t for t in toks if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token {bad} is outside the vocabulary (0..{n_vocab - 1})")
        n_ctx = self._target_ctx.n_ctx
        if len(toks) > n_ctx - 1:
            raise ValueError(f"the prompt has {len(toks)} tokens but the context holds {n_ctx} "
                             "(and at least one more is needed to generate); use a larger n_ctx")
        return toks

    def _generator(self, cfg: GenerationConfig):
        """A compiled generator for ``cfg``, and whether it needs the cost model calibrated."""
        self._check_open()
        use_draft = cfg.speculative and self._draft_ctx is not None
        lookup = cfg.lookup and cfg.speculative
        if self.batch_invariant and self.max_verify_batch <= 1:
            use_draft = lookup = False
        nd = AUTO_DRAFT_MAX if cfg.adaptive else cfg.n_draft
        free = []
        if cfg.speculative and not (self.batch_invariant and self.max_verify_batch <= 1):
            if cfg.prediction is not None:
                free.append(self._prediction_proposer(cfg.prediction))
            if self.corpus is not None and cfg.suffix and len(self.corpus):
                if self._suffix_proposer is None or self._suffix_proposer[0] is not self.corpus:
                    self._suffix_proposer = (self.corpus, self.corpus.proposer())
                free.append(self._suffix_proposer[1])
        calibrate = cfg.adaptive and (use_draft or lookup or bool(free))
        if calibrate and not self.cost_model.calibrated:
            self._restore_costs(use_draft)      # (before the generator's policy reads the costs)
        gen = _core.Generator(
            self._target_ctx, self._draft_ctx if use_draft else None,
            temperature=float(cfg.temperature), top_k=cfg.top_k, top_p=float(cfg.top_p),
            min_p=float(cfg.min_p), seed=cfg.seed, n_draft=nd, n_draft_min=min(cfg.n_draft_min, nd),
            p_min=float(cfg.p_min), adaptive=cfg.adaptive, max_tokens=cfg.max_tokens,
            stop=[x.encode("utf-8") for x in cfg.stop if x], lookup=lookup,
            max_verify=self.max_verify_batch, ngram_min=cfg.ngram_min, ngram_max=cfg.ngram_max,
            cost=self.cost_model, acceptance=self.acceptance, proposers=free, trace=cfg.trace)
        return gen, calibrate

    def _costs_key(self) -> str:
        """The cost cache's key for this decoder (its settings do not change: made once; it
        reads the model files' identities and the CPU's name)."""
        if self._cost_key is None:
            t, d = self.target_model, self.draft_model
            self._cost_key = _cost_cache.key(target=t.path, draft=d.path if d is not None else None,
                                             n_threads=self._target_ctx.n_threads, target_on_gpu=t.on_gpu,
                                             draft_on_gpu=d is not None and d.on_gpu, use_mmap=t.use_mmap,
                                             flash_attn=self._flash_attn, n_batch=self._n_batch,
                                             max_verify=self.max_verify_batch, draft_vocab=self.draft_vocab)
        return self._cost_key

    def _restore_costs(self, use_draft: bool) -> None:
        """The cost cache's costs for this decoder, where it holds them (with the draft
        token's cost where the draft will run): the model marked calibrated."""
        if self._cost_cache is None:
            return
        state = _cost_cache.load(self._cost_cache, self._costs_key())
        if state is None or (use_draft and not state.get("draft")):
            return
        try:
            self.cost_model.restore(state)
        except ValueError:
            return                  # (a file edited by hand, say: calibrated as without one)
        self.costs_restored = True

    def _prediction_proposer(self, prediction):
        if isinstance(prediction, str):
            ids = self.target_model.tokenize(prediction, add_special=False)
            if not ids:
                raise ValueError("prediction is empty (it tokenizes to no tokens)")
        else:
            ids = list(prediction)
        return _core.PredictionProposer(ids, self.target_model.n_vocab)

    def _learn(self, toks, gen) -> None:
        """With a corpus: add this generation's prompt and output to it."""
        if self.corpus is not None:
            self.corpus.add(list(toks) + list(gen.tokens))

    def _start(self, gen, calibrate: bool, toks) -> None:
        """Prefill; on the first adaptive speculative run, time the verification batch
        sizes and one draft token (about 2-4 s on a 2-core CPU with a 1.5B target;
        reported as t_calibrate, outside tokens/s)."""
        gen.start(toks, self._draft_hints(toks) if gen.draft_trimmed else ())
        if calibrate and not self.cost_model.calibrated:
            gen.calibrate()
            if self._cost_cache is not None:
                _cost_cache.save(self._cost_cache, self._costs_key(), self.cost_model.state())

    def _draft_hints(self, toks) -> list[int]:
        """Ids beyond a trimmed draft vocabulary's leading ones that this prompt's answer is
        likely to use: the prompt's words in the forms ``_word_forms`` lists and
        ``DRAFT_HINT_TEXT``, tokenized by the draft (one call; at most half of the extra
        ids a context holds, the rest left for the ids the output brings)."""
        text = self.target_model.detokenize(list(toks))
        lines = _word_forms(text) + list(DRAFT_HINT_TEXT)
        lead = self.draft_vocab
        ids = dict.fromkeys(t for t in self.draft_model.tokenize("\n".join(lines), add_special=False)
                            if t >= lead)
        return list(ids)[:_core.EXTRA_LOGITS_LIMIT // 2]

    def _acquire(self):
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this SpeculativeDecoder is already generating in another thread; "
                               "use one decoder per thread")

    def generate(self, prompt, *, max_tokens: int = 256, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0, seed: int | None = None,
                 stop: str | Sequence[str] | None = None, n_draft: int | str = "auto",
                 n_draft_min: int = 0, p_min: float = 0.0, lookup: bool = False,
                 ngram_min: int = GenerationConfig.ngram_min, ngram_max: int = GenerationConfig.ngram_max,
                 speculative: bool = True, add_special: bool = True,
                 prediction: str | Sequence[int] | None = None, suffix: bool = True,
                 trace: bool = False) -> GenerationResult:
        """Generate a completion of ``prompt`` (a string or token ids).

        Greedy at ``temperature=0`` (the default); otherwise sampled with temperature,
        then top-k, top-p and min-p, with ``seed`` for reproducibility.  ``n_draft`` is
        the most tokens proposed per target pass, or ``"auto"``: each pass, the policy
        compares what every proposer (draft model, n-gram lookup) is expected to give per
        second at each length with the target alone, from measured costs and the
        acceptance seen so far, and runs the best (the target alone when nothing pays).
        ``lookup=True`` adds n-gram proposals: the tokens that followed the latest
        earlier occurrence of the longest suffix of ``ngram_max`` down to ``ngram_min``
        tokens.  ``prediction`` is the output you expect (text or token ids; e.g. the
        code being edited): proposals follow it, re-aligning after insertions and
        deletions.  With a decoder ``corpus``, earlier prompts and outputs are proposed
        from too (``suffix=False`` turns that off for one call), and each generation is
        added to the corpus.  ``speculative=False`` runs the target alone (the baseline).
        ``trace=True`` records each target pass as the policy saw it (what it chose, what it
        expected, what came of it) in ``stats.trace``; ``stats.explain()`` prints it.  Ctrl-C
        stops between two target passes; the decoder stays usable.
        """
        cfg = GenerationConfig(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                               min_p=min_p, seed=seed, stop=stop, n_draft=n_draft, n_draft_min=n_draft_min,
                               p_min=p_min, lookup=lookup, ngram_min=ngram_min, ngram_max=ngram_max,
                               speculative=speculative, add_special=add_special,
                               prediction=prediction, suffix=suffix, trace=trace)
        return self.generate_config(prompt, cfg)

    def generate_config(self, prompt, cfg: GenerationConfig) -> GenerationResult:
        """``generate()`` with its settings as one ``GenerationConfig``."""
        self._acquire()
        try:
            self._check_open()
            toks = self._checked_prompt(prompt, cfg.add_special)
            gen, calibrate = self._generator(cfg)
            self._start(gen, calibrate, toks)
            gen.run()
            self._learn(toks, gen)
            return self._result(gen)
        finally:
            self._lock.release()

    def _result(self, gen) -> GenerationResult:
        text = gen.text_bytes.decode("utf-8", "replace")
        return GenerationResult(text=text, tokens=gen.tokens, finish_reason=gen.finish_reason,
                                stats=GenerationStats.from_core(gen.stats()),
                                sources=[SOURCE_NAMES[s] for s in gen.sources])

    def stream(self, prompt, **kwargs) -> Iterator[StreamPiece]:
        """Like ``generate()`` (same keyword arguments), but yields ``StreamPiece``s as
        target passes complete.  Arguments and the prompt are checked at the call; the
        decoder is taken when iteration starts and given back when the stream ends, is
        closed, raises, or is garbage-collected (a stream never iterated holds nothing)."""
        cfg = GenerationConfig.from_kwargs(**kwargs)
        self._check_open()
        toks = self._checked_prompt(prompt, cfg.add_special)
        if cfg.prediction is not None:
            self._prediction_proposer(cfg.prediction)     # bad ids raise here, at the call
        return self._stream(toks, cfg)

    def _stream(self, toks, cfg: GenerationConfig) -> Iterator[StreamPiece]:
        self._acquire()
        try:
            gen, calibrate = self._generator(cfg)
            self._start(gen, calibrate, toks)
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            sent = 0
            while gen.finish_reason is None:
                tokens, sources = gen.step()
                safe = gen.safe_text_len
                chunk = gen.text_bytes[sent:safe] if safe > sent else b""
                sent = max(sent, safe)
                text = decoder.decode(chunk, final=gen.finish_reason is not None)
                if tokens or text:
                    yield StreamPiece(text, tokens, [SOURCE_NAMES[s] for s in sources])
            self._learn(toks, gen)
            self.last_result = self._result(gen)     # text/tokens/stats of the finished stream
        finally:
            self._lock.release()

    def chat(self, messages: Sequence[dict], **kwargs) -> GenerationResult:
        """Generate the assistant's reply to ``messages`` with the target's chat template."""
        prompt = self.target_model.apply_chat_template(list(messages), add_assistant=True)
        return self.generate(prompt, add_special=False, **kwargs)


def generate(prompt, *, target, draft=None, n_ctx: int = 4096, n_threads: int | None = None,
             n_gpu_layers: int = -1, cost_cache=True, **kwargs) -> GenerationResult:
    """One-shot generation: load ``target`` (and ``draft``), generate, free them.

    To generate more than once, keep a ``SpeculativeDecoder``: loading models takes
    seconds.  ``cost_cache`` as for ``SpeculativeDecoder`` (the costs a first call timed
    serve the calls after it, in later processes too).  Other keyword arguments are those
    of ``SpeculativeDecoder.generate``.
    """
    with SpeculativeDecoder(target, draft, n_ctx=n_ctx, n_threads=n_threads,
                            n_gpu_layers=n_gpu_layers, cost_cache=cost_cache) as dec:
        return dec.generate(prompt, **kwargs)
