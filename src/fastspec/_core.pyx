# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""fastspec's compiled core: libllama models and contexts, and the generation loop.

Everything that runs once per token lives here and runs without the GIL.
The public, documented API is in fastspec.api; this module is its engine.
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, calloc, realloc, free
from libc.string cimport memcpy, memset
from libc.math cimport expf
from cpython.exc cimport PyErr_CheckSignals
cimport cython

cimport fastspec.libllama as ll

import operator
import os
import re
import statistics
import sys

cdef enum:
    MAX_EXTRA_LOGITS = 1024   # Context.set_n_logits: extra ids beyond the leading ones (llama.cpp's limit)

include "_sampling.pxi"
include "_ngram.pxi"
include "_proposer.pxi"
include "_policy.pxi"
include "_lookup.pxi"
include "_draft.pxi"
include "_predict.pxi"
include "_suffix.pxi"
include "_engine.pxi"

LLAMA_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
EXTRA_LOGITS_LIMIT = MAX_EXTRA_LOGITS    # (for Python: Context.set_n_logits's extra ids)

# ---------------------------------------------------------------------------
# llama.cpp's log lines: off unless asked for
# ---------------------------------------------------------------------------
cdef int _log_min_level = 99          # ggml_log_level at or above which lines go to Python
cdef int _log_last_level = 0
_log_sink = None                      # callable(level:int, text:str), set by fastspec._logging


cdef void _log_callback(ll.ggml_log_level level, const char * text, void * ud) noexcept nogil:
    global _log_last_level
    cdef int lv = <int>level
    if lv == <int>ll.GGML_LOG_LEVEL_CONT:
        lv = _log_last_level
    else:
        _log_last_level = lv
    if lv < _log_min_level:
        return
    with gil:
        sink = _log_sink
        if sink is not None:
            try:
                sink(lv, (<bytes>text).decode("utf-8", "replace"))
            except BaseException:
                pass


def set_log_level(int level, sink=None):
    """Forward llama.cpp log lines at ``level`` (ggml: 1 debug .. 4 error) or above to
    ``sink(level, text)``; a level above 4 silences them (the default)."""
    global _log_min_level, _log_sink
    _log_sink = sink
    _log_min_level = level


ll.llama_log_set(_log_callback, NULL)
ll.llama_backend_init()


def system_info():
    """llama.cpp's description of the compiled backends and CPU features."""
    return (<bytes>ll.llama_print_system_info()).decode("utf-8", "replace")


def amx_kept():
    """Whether this build kept ggml's Intel AMX kernels: only when built with
    CMAKE_ARGS="-DFASTSPEC_AMX=ON" on a machine where AMX code built like ggml's runs.  They
    take quantized weights away from the verification kernels fastspec's patches add and make
    one-token and short batched passes slower (cmake/amx_probe.cmake has the figures)."""
    return bool(ll.FASTSPEC_AMX_KEPT)


def supports_gpu_offload():
    return bool(ll.llama_supports_gpu_offload())


def invariant_rows():
    """The largest verification batch whose logits the CPU backend computes bit-identically
    to one-token decodes, by construction (this build's ggml patches): 16 unless the
    environment's GGML_CPU_INVARIANT_ROWS says otherwise (ggml reads it the same way, once);
    0 when built without the patches (-DFASTSPEC_PATCHES=OFF) or turned off with 0."""
    if ll.FASTSPEC_INVARIANT_ROWS <= 0:
        return 0
    env = os.environ.get("GGML_CPU_INVARIANT_ROWS")
    if env is None:
        return ll.FASTSPEC_INVARIANT_ROWS
    m = re.match(r"\s*[+-]?\d+", env)          # as C's atoll reads it
    return max(0, int(m.group())) if m else 0


def cuda_invariant_rows():
    """The CUDA backend's counterpart of invariant_rows() (patches 0022-0024): the largest
    verification batch whose logits ggml-cuda computes bit-identically to one-token decodes, by
    construction, with flash attention on and quantized weights: 16 unless the environment's
    GGML_CUDA_INVARIANT_ROWS says less (ggml reads it once; 0 turns it off); 0 on builds
    without CUDA or without the patches."""
    return int(ll.fastspec_cuda_invariant_rows())


def zmm_pairs():
    """Where the CPU backend's AVX-512 rows kernels take two weight blocks per 512-bit register
    (patches 0014-0017, 0047): 1 for every row count (AMD Zen 5, where 512-bit vectors run at
    full width), 2 for one-row products alone (one-token passes; Intel Xeons from Sapphire
    Rapids on), 0 nowhere (the 256-bit kernels).  Decided once from the CPU unless
    GGML_CPU_ZMM_PAIRS=0/1/2 says; 0 without AVX-512 kernels or without the patches.  Either
    way the logits are the same bits; only speed differs."""
    return int(ll.fastspec_zmm_pairs())


def q4_0_rows_for_prompts():
    """Whether repacked Q4_0 weights times a batch past the verification range (a prompt, a
    draft model's catch-up) take the rows kernel 16 rows at a time instead of ggml's gemm
    (patches 0012, 0021): decided once from the CPU (where it was measured faster: AVX2
    without AVX-512, and AMD Zen 4) unless GGML_CPU_Q4_0_ROWS_PROMPTS=0/1 says; False without
    the patches.  Speed only: prompts are not compared with anything."""
    return bool(ll.fastspec_q4_0_rows_prompts())


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------
cdef _check_gguf_file(str path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file not found: {path}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"expected a GGUF model file, got a directory: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"not a GGUF file (bad magic {magic!r}): {path}")


cdef class Model:
    """A GGUF model loaded by libllama (weights, vocabulary and metadata).

    ``use_mmap``: None (the default) reads a model the CPU runs on Linux into memory of its
    own (huge pages, faster passes; loading takes a little longer and the weights are not
    shared with other processes) and leaves the choice to llama.cpp elsewhere; True maps the
    file, False reads it in."""
    cdef ll.llama_model * ptr
    cdef const ll.llama_vocab * vocab
    cdef readonly str path
    cdef readonly int n_vocab
    cdef readonly bint repack
    cdef readonly bint use_mmap     # the file is mapped (False: read into buffers of its own)
    cdef readonly bint on_gpu       # layers offloaded to a GPU backend (n_gpu_layers != 0 on a GPU build)
    cdef int n_contexts             # open Contexts made from it: they keep the weights (see close)
    cdef bint closing               # close() came while some were open: freed when the last closes

    def __cinit__(self, path, *, int n_gpu_layers=-1, use_mmap=None, bint vocab_only=False,
                  bint repack=True):
        self.ptr = NULL
        self.path = os.fspath(path)
        _check_gguf_file(self.path)
        cdef ll.llama_model_params p = ll.llama_model_default_params()
        p.n_gpu_layers = n_gpu_layers
        p.vocab_only = vocab_only
        p.use_extra_bufts = repack
        self.repack = repack
        self.on_gpu = n_gpu_layers != 0 and not vocab_only and ll.llama_supports_gpu_offload()
        if use_mmap is None:
            # a model the CPU runs on Linux is read into memory of its own: patch 0035 gives
            # those buffers huge pages, and a pass then streams its weights without a page walk
            # per 4 KiB (one-token passes 4-7 % shorter on the AMD EPYC measured); the page
            # cache's mmapped pages stay 4 KiB.  Elsewhere (a GPU, macOS) llama.cpp's choice.
            use_mmap = not (sys.platform.startswith("linux") and not self.on_gpu and not vocab_only)
        self.use_mmap = use_mmap
        if not use_mmap:
            p.load_mode = ll.LLAMA_LOAD_MODE_NONE
        cdef bytes bpath = self.path.encode()
        cdef const char * cpath = bpath
        with nogil:
            self.ptr = ll.llama_model_load_from_file(cpath, p)
        if self.ptr == NULL:
            raise ValueError(f"libllama could not load {self.path!r} (corrupt, truncated or unsupported "
                             "GGUF; fastspec.set_verbosity('info') shows llama.cpp's reason)")
        self.vocab = ll.llama_model_get_vocab(self.ptr)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)

    def __dealloc__(self):
        if self.ptr != NULL:
            ll.llama_model_free(self.ptr)
            self.ptr = NULL

    cdef inline void _check(self) except *:
        if self.ptr == NULL or self.closing:
            raise RuntimeError("this Model is closed")

    def close(self):
        """Close the Model: its weights are freed now, or, while Contexts made from it are
        open, when the last of them is closed (they keep working until then: a context's
        own teardown reads its model, so the weights never go first)."""
        if self.n_contexts > 0:
            self.closing = True
        elif self.ptr != NULL:
            ll.llama_model_free(self.ptr)
            self.ptr = NULL

    cdef void _release(self) noexcept:
        """A Context made from this Model was freed."""
        self.n_contexts -= 1
        if self.n_contexts == 0 and self.closing and self.ptr != NULL:
            ll.llama_model_free(self.ptr)
            self.ptr = NULL

    @property
    def closed(self):
        return self.ptr == NULL or self.closing

    # -- description ------------------------------------------------------
    @property
    def description(self):
        self._check()
        cdef char buf[512]
        n = ll.llama_model_desc(self.ptr, buf, sizeof(buf))
        return buf[:max(n, 0)].decode("utf-8", "replace")

    @property
    def size_bytes(self):
        self._check()
        return ll.llama_model_size(self.ptr)

    @property
    def n_params(self):
        self._check()
        return ll.llama_model_n_params(self.ptr)

    @property
    def n_ctx_train(self):
        self._check()
        return ll.llama_model_n_ctx_train(self.ptr)

    @property
    def n_layer(self):
        self._check()
        return ll.llama_model_n_layer(self.ptr)

    @property
    def n_embd(self):
        self._check()
        return ll.llama_model_n_embd(self.ptr)

    @property
    def is_recurrent(self):
        self._check()
        return bool(ll.llama_model_is_recurrent(self.ptr) or ll.llama_model_is_hybrid(self.ptr))

    @property
    def metadata(self):
        """The GGUF key/value metadata as a dict of strings."""
        self._check()
        cdef int n = ll.llama_model_meta_count(self.ptr)
        cdef char kbuf[256]
        cdef int vlen
        cdef char * vbuf
        out = {}
        for i in range(n):
            klen = ll.llama_model_meta_key_by_index(self.ptr, i, kbuf, sizeof(kbuf))
            if klen < 0:
                continue
            vlen = ll.llama_model_meta_val_str_by_index(self.ptr, i, NULL, 0)
            if vlen < 0:
                continue
            vbuf = <char *>malloc(vlen + 1)
            try:
                ll.llama_model_meta_val_str_by_index(self.ptr, i, vbuf, vlen + 1)
                out[kbuf[:klen].decode("utf-8", "replace")] = vbuf[:vlen].decode("utf-8", "replace")
            finally:
                free(vbuf)
        return out

    # -- vocabulary -------------------------------------------------------
    @property
    def vocab_type(self):
        """'spm', 'bpe', 'wpm', 'ugm', 'rwkv', 'plamo2' or 'none'."""
        self._check()
        return {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}.get(
            <int>ll.llama_vocab_get_type(self.vocab), "other")

    @property
    def bos(self):
        self._check()
        return ll.llama_vocab_bos(self.vocab)

    @property
    def eos(self):
        self._check()
        return ll.llama_vocab_eos(self.vocab)

    @property
    def eot(self):
        self._check()
        return ll.llama_vocab_eot(self.vocab)

    @property
    def add_bos(self):
        self._check()
        return bool(ll.llama_vocab_get_add_bos(self.vocab))

    @property
    def add_eos(self):
        self._check()
        return bool(ll.llama_vocab_get_add_eos(self.vocab))

    def is_eog(self, int token):
        """True for end-of-generation tokens (EOS, EOT, ...)."""
        self._check()
        self._check_token(token)
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    @property
    def eog_tokens(self):
        self._check()
        return [t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(self.vocab, t)]

    cdef inline void _check_token(self, int token) except *:
        if token < 0 or token >= self.n_vocab:
            raise ValueError(f"token id {token} is outside the vocabulary (0..{self.n_vocab - 1})")

    def token_text(self, int token):
        """The raw text of a token as stored in the vocabulary."""
        self._check()
        self._check_token(token)
        cdef const char * t = ll.llama_vocab_get_text(self.vocab, token)
        return (<bytes>t).decode("utf-8", "replace") if t != NULL else ""

    def tokenize(self, text, *, bint add_special=True, bint parse_special=False):
        """Text -> list of token ids (``add_special`` adds BOS/EOS as the model asks)."""
        self._check()
        cdef bytes b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        if len(b) > 0x3fffffff:
            raise ValueError("text too long to tokenize")
        cdef int cap = len(b) + 8
        cdef ll.llama_token * buf = <ll.llama_token *>malloc(cap * sizeof(ll.llama_token))
        if buf == NULL:
            raise MemoryError()
        cdef int n
        try:
            n = ll.llama_tokenize(self.vocab, b, len(b), buf, cap, add_special, parse_special)
            if n < 0:
                cap = -n
                buf = <ll.llama_token *>realloc(buf, cap * sizeof(ll.llama_token))
                n = ll.llama_tokenize(self.vocab, b, len(b), buf, cap, add_special, parse_special)
            if n < 0:
                raise RuntimeError("tokenization failed")
            return [buf[i] for i in range(n)]
        finally:
            free(buf)

    def token_to_piece(self, int token, *, bint special=False):
        """The bytes one token contributes to the text (may be part of a UTF-8 character)."""
        self._check()
        self._check_token(token)
        cdef char buf[256]
        cdef int n = ll.llama_token_to_piece(self.vocab, token, buf, sizeof(buf), 0, special)
        if n < 0:
            raise RuntimeError(f"token {token} has a piece longer than {sizeof(buf)} bytes")
        return buf[:n]

    def detokenize(self, tokens, *, bint remove_special=False, bint unparse_special=False):
        """List of token ids -> text."""
        self._check()
        cdef int nt = len(tokens)
        cdef ll.llama_token * tb = <ll.llama_token *>malloc(max(nt, 1) * sizeof(ll.llama_token))
        cdef char * out = NULL
        cdef int cap = nt * 8 + 16
        cdef int n
        try:
            for i in range(nt):
                t = tokens[i]
                self._check_token(t)
                tb[i] = t
            out = <char *>malloc(cap)
            n = ll.llama_detokenize(self.vocab, tb, nt, out, cap, remove_special, unparse_special)
            if n < 0:
                cap = -n
                out = <char *>realloc(out, cap)
                n = ll.llama_detokenize(self.vocab, tb, nt, out, cap, remove_special, unparse_special)
            if n < 0:
                raise RuntimeError("detokenization failed")
            return out[:n].decode("utf-8", "replace")
        finally:
            free(tb)
            free(out)

    def chat_template(self, name=None):
        """The model's chat template (a Jinja string), or None if it has none."""
        self._check()
        cdef bytes bname
        cdef const char * r
        if name is None:
            r = ll.llama_model_chat_template(self.ptr, NULL)
        else:
            bname = name.encode()
            r = ll.llama_model_chat_template(self.ptr, bname)
        return None if r == NULL else (<bytes>r).decode("utf-8", "replace")

    def apply_chat_template(self, messages, *, bint add_assistant=True, template=None):
        """Format ``[{"role": ..., "content": ...}, ...]`` with the model's chat template
        (or ``template``, a template string or a built-in template name)."""
        self._check()
        tmpl = template if template is not None else self.chat_template()
        if tmpl is None:
            raise ValueError("this model has no chat template; pass template=... or format the prompt yourself")
        cdef list keep = []
        cdef int n = len(messages)
        if n == 0:
            raise ValueError("messages is empty")
        cdef ll.llama_chat_message * msgs = <ll.llama_chat_message *>malloc(n * sizeof(ll.llama_chat_message))
        cdef bytes btmpl = tmpl.encode()
        cdef int total = 0
        cdef int cap
        cdef char * buf = NULL
        try:
            for i, m in enumerate(messages):
                try:
                    role = m["role"].encode()
                    content = m["content"].encode()
                except (KeyError, TypeError, AttributeError):
                    raise ValueError(f"message {i} must be a dict with string 'role' and 'content'") from None
                keep.append(role)
                keep.append(content)
                msgs[i].role = role
                msgs[i].content = content
                total += len(role) + len(content)
            cap = total * 2 + 1024
            buf = <char *>malloc(cap)
            r = ll.llama_chat_apply_template(btmpl, msgs, n, add_assistant, buf, cap)
            if r > cap:
                cap = r + 1
                buf = <char *>realloc(buf, cap)
                r = ll.llama_chat_apply_template(btmpl, msgs, n, add_assistant, buf, cap)
            if r < 0:
                raise ValueError("llama.cpp does not support this chat template (it knows a fixed list of "
                                 "templates); format the prompt yourself")
            return buf[:r].decode("utf-8", "replace")
        finally:
            free(msgs)
            free(buf)

    def vocab_differences(self, Model other, int max_size_diff=128):
        """Reasons why ``other`` cannot draft for this model (empty list if it can)."""
        self._check()
        other._check()
        out = []
        if self.vocab_type != other.vocab_type:
            out.append(f"vocabulary types differ: {self.vocab_type} vs {other.vocab_type}")
        if abs(self.n_vocab - other.n_vocab) > max_size_diff:
            out.append(f"vocabulary sizes differ by more than {max_size_diff}: {self.n_vocab} vs {other.n_vocab}")
        if self.add_bos != other.add_bos or (self.add_bos and self.bos != other.bos):
            out.append(f"BOS handling differs: add_bos {self.add_bos}/{other.add_bos}, bos {self.bos}/{other.bos}")
        if self.eos != other.eos:
            out.append(f"EOS tokens differ: {self.eos} vs {other.eos}")
        if out:
            return out
        cdef int n = min(self.n_vocab, other.n_vocab)
        cdef int t
        cdef const char * a
        cdef const char * b
        for t in range(n):
            a = ll.llama_vocab_get_text(self.vocab, t)
            b = ll.llama_vocab_get_text(other.vocab, t)
            if (a == NULL) != (b == NULL) or (a != NULL and <bytes>a != <bytes>b):
                out.append(f"token {t} differs: {self.token_text(t)!r} vs {other.token_text(t)!r}")
                if len(out) >= 5:
                    break
        return out


def quantize(src, dst, ftype, *, int n_threads=0, bint allow_requantize=True, bint pure=False,
             bint quantize_output=True):
    """Write ``dst``, a copy of GGUF ``src`` quantized to ``ftype`` (a llama_ftype number).
    ``pure`` gives every tensor that type (no per-tensor mixture); ``quantize_output=False``
    copies the output tensor as it is."""
    src = os.fspath(src)
    dst = os.fspath(dst)
    _check_gguf_file(src)
    cdef ll.llama_model_quantize_params p = ll.llama_model_quantize_default_params()
    p.nthread = n_threads
    p.ftype = <ll.llama_ftype><int>ftype
    p.allow_requantize = allow_requantize
    p.pure = pure
    p.quantize_output_tensor = quantize_output
    cdef bytes bs = src.encode(), bd = dst.encode()
    cdef const char * cs = bs
    cdef const char * cd = bd
    cdef uint32_t rc
    with nogil:
        rc = ll.llama_model_quantize(cs, cd, &p)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed ({rc}) for {src} -> {dst}")


# ---------------------------------------------------------------------------
# Context
# ---------------------------------------------------------------------------
@cython.no_gc_clear   # its Model must outlive it (see Model.close), also when freed by the cycle collector
cdef class Context:
    """An inference context (KV cache + compute buffers) on a Model, sequence 0 only."""
    cdef ll.llama_context * ptr
    cdef readonly Model model
    cdef bint holds                     # counted in model.n_contexts (until _free)
    cdef ll.llama_batch batch
    cdef readonly int n_ctx
    cdef readonly int n_batch
    cdef readonly int n_threads
    cdef int n_out                      # outputs of the last decode
    cdef int32_t * out_pos              # output row -> batch position, for the last decode
    cdef public int n_past              # sequence positions covered (0..n_past-1; see skip_at)
    cdef ll.llama_token * hist          # the tokens at those positions (n_ctx of room)
    # with n_skip > 0 the sequence positions [skip_at, skip_at + n_skip) were never decoded
    # (a draft model that catches up with only the last tokens of a long stretch, see
    # _skip_to): the tokens after them sit n_skip places earlier in the KV cache, so the
    # model reads the text as if that stretch were not there
    cdef int skip_at
    cdef int n_skip
    cdef bint can_trim                  # a common prefix can be kept (not recurrent, no sliding window)
    cdef readonly int n_logits          # logits computed for ids [0, n_logits) (the vocabulary: all)
    cdef readonly int n_extra           # ... and for this many ids beyond

    def __cinit__(self, Model model not None, *, int n_ctx=4096, int n_batch=512, n_threads=None,
                  flash_attn=None):
        self.ptr = NULL
        model._check()
        if n_ctx < 8:
            raise ValueError(f"n_ctx must be at least 8, got {n_ctx}")
        if n_batch < 1:
            raise ValueError(f"n_batch must be at least 1, got {n_batch}")
        self.model = model
        if n_threads is None:
            n_threads = default_threads()
        if n_threads < 1:
            raise ValueError(f"n_threads must be at least 1, got {n_threads}")
        cdef ll.llama_context_params p = ll.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = min(n_batch, n_ctx)
        p.n_ubatch = p.n_batch
        p.n_seq_max = 1
        p.n_threads = n_threads
        p.n_threads_batch = n_threads
        p.no_perf = True
        if flash_attn is None:
            p.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_AUTO
        elif flash_attn:
            p.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED
        else:
            p.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        with nogil:
            self.ptr = ll.llama_init_from_model(model.ptr, p)
        if self.ptr == NULL:
            raise RuntimeError(f"libllama could not create a context (n_ctx={n_ctx}); out of memory?")
        model.n_contexts += 1
        self.holds = True
        self.n_ctx = ll.llama_n_ctx(self.ptr)
        self.n_batch = ll.llama_n_batch(self.ptr)
        self.n_threads = n_threads
        self.batch = ll.llama_batch_init(self.n_batch, 0, 1)
        self.out_pos = <int32_t *>calloc(self.n_batch, sizeof(int32_t))
        self.hist = <ll.llama_token *>calloc(self.n_ctx, sizeof(ll.llama_token))
        if self.out_pos == NULL or self.hist == NULL:
            self._free()
            raise MemoryError("no memory for the context's bookkeeping")
        self.can_trim = not (ll.llama_model_is_recurrent(model.ptr) or ll.llama_model_is_hybrid(model.ptr)
                             or ll.llama_model_n_swa(model.ptr) > 0)
        self.n_past = 0
        self.skip_at = 0
        self.n_skip = 0
        self.n_out = 0
        self.n_logits = model.n_vocab
        self.n_extra = 0

    def __dealloc__(self):
        self._free()

    cdef void _free(self) noexcept:
        if self.ptr != NULL:
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ptr)
            free(self.out_pos)
            self.out_pos = NULL
            free(self.hist)
            self.hist = NULL
            self.ptr = NULL
        if self.holds:
            self.holds = False
            self.model._release()

    def close(self):
        self._free()

    @property
    def closed(self):
        return self.ptr == NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    cdef inline void _check(self) except *:
        if self.ptr == NULL:
            raise RuntimeError("this Context is closed")

    cdef int _decode(self, const ll.llama_token * toks, int n, int logits_from) noexcept nogil:
        """Decode ``n`` tokens at positions n_past.., asking for logits from batch index
        ``logits_from`` on (n-1: last only; n: none).  Splits into n_batch chunks.
        Returns llama_decode's code (0 = success)."""
        cdef int done = 0, m, i, rc, k = 0
        while done < n:
            m = n - done
            if m > self.n_batch:
                m = self.n_batch
            self.batch.n_tokens = m
            for i in range(m):
                self.batch.token[i] = toks[done + i]
                self.batch.pos[i] = self.n_past + i - self.n_skip
                if self.n_past + i < self.n_ctx:
                    self.hist[self.n_past + i] = toks[done + i]
                self.batch.n_seq_id[i] = 1
                self.batch.seq_id[i][0] = 0
                if done + i >= logits_from:
                    self.batch.logits[i] = 1
                    self.out_pos[k] = i
                    k += 1
                else:
                    self.batch.logits[i] = 0
            rc = ll.llama_decode(self.ptr, self.batch)
            if rc != 0:
                return rc
            self.n_past += m
            done += m
            if done < n:
                k = 0
        # A GPU backend returns from llama_decode with the pass still running (the logits
        # are fetched when read): wait for it, so that whoever times a decode times the pass
        # itself (the cost model) and not its launch.  (The next step reads the logits at
        # once, so nothing that could overlap is lost; on the CPU this is a no-op.)
        ll.llama_synchronize(self.ptr)
        self.n_out = k
        return 0

    def set_n_logits(self, n, extra=()):
        """Compute logits for the token ids ``[0, n)`` only (rounded up to 64; ``None``:
        all) and for the ids in ``extra`` (at most 1024), the rest of each row reading
        ``-inf``.  The output matmul then reads only those rows of the output matrix: for
        a draft model, whose output matrix is a large share of a token's cost, a cheaper
        token.  Returns the leading ids now covered, which stays the whole vocabulary where
        the build (no ggml patches) or the model (LoRA, an output bias or scale) cannot do it."""
        cdef int v, want, k = 0
        cdef ll.llama_token buf[MAX_EXTRA_LOGITS]
        self._check()
        v = self.model.n_vocab
        if n is None:
            n = v
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an integer or None, got {n!r}")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        ids = sorted({int(x) for x in extra})
        bad = [x for x in ids if not 0 <= x < v]
        if bad:
            raise ValueError(f"extra ids must be in [0, {v}), got {bad[0]}")
        if len(ids) > MAX_EXTRA_LOGITS:
            raise ValueError(f"at most {MAX_EXTRA_LOGITS} extra ids, got {len(ids)}")
        want = min(v, ((n + 63) // 64) * 64)      # as llama_set_n_logits rounds
        for x in ids:
            if x >= want:
                buf[k] = <ll.llama_token>x
                k += 1
        if self._set_n_logits(want, buf, k) != 0:
            raise MemoryError("no memory for the extra ids' rows of the output matrix")
        return self.n_logits

    cdef int _set_n_logits(self, int n, const ll.llama_token * extra, int n_extra) noexcept nogil:
        """0 when set (or the build/model cannot: all logits as before), -1 when refused for
        want of memory after it had been possible."""
        cdef int v = self.model.n_vocab
        if ll.fastspec_set_n_logits(self.ptr, 0 if n >= v else n, extra, n_extra):
            self.n_logits = v if n >= v else n
            self.n_extra = n_extra if n < v else 0
            return 0
        return -1 if self.n_logits < v else 0

    cdef inline float * _logits(self, int i) noexcept nogil:
        """Logits of output row ``i`` of the last decode."""
        return ll.llama_get_logits_ith(self.ptr, self.out_pos[i])

    cdef bint _remove_from(self, int pos) noexcept nogil:
        """Drop KV entries at sequence positions >= pos.  Within or at the end of a
        skipped stretch: back to where the stretch began (what comes after it is gone)."""
        if pos >= self.n_past:
            return True
        if self.n_skip > 0 and pos <= self.skip_at + self.n_skip:
            if pos > self.skip_at:
                pos = self.skip_at
            if not ll.llama_memory_seq_rm(ll.llama_get_memory(self.ptr), 0, pos, -1):
                return False
            self.n_skip = 0
        elif not ll.llama_memory_seq_rm(ll.llama_get_memory(self.ptr), 0, pos - self.n_skip, -1):
            return False
        self.n_past = pos
        return True

    cdef bint _skip_to(self, int pos) noexcept nogil:
        """Leave sequence positions n_past..pos-1 out: the next decode continues at
        sequence position ``pos`` right after what the cache holds.  One stretch at a time:
        a second skip drops what was decoded after the first and widens it."""
        if pos <= self.n_past:
            return True
        if self.n_skip > 0:
            if not ll.llama_memory_seq_rm(ll.llama_get_memory(self.ptr), 0, self.skip_at, -1):
                return False
        else:
            self.skip_at = self.n_past
        self.n_skip = pos - self.skip_at
        self.n_past = pos
        return True

    @property
    def skipped(self):
        """(start, length) of the stretch of the sequence left out of the cache (by a
        catch-up that read only its last tokens), or None."""
        return (self.skip_at, self.n_skip) if self.n_skip > 0 else None

    def skip_to(self, int pos):
        """Continue the sequence at position ``pos`` without decoding the tokens before it
        (from n_past on): the model reads on as if they were not there."""
        self._check()
        if pos < self.n_past or pos > self.n_ctx:
            raise ValueError(f"pos must be in [{self.n_past}, {self.n_ctx}], got {pos}")
        if not self.can_trim or not self._skip_to(pos):
            raise RuntimeError("this model's memory cannot leave out part of a sequence")

    cdef int _keep_prefix(self, const ll.llama_token * toks, int n) noexcept nogil:
        """Keep the KV entries of the longest common prefix of what this context holds
        and toks[0:n], drop the rest; returns how many tokens were kept (0: cleared)."""
        cdef int keep = 0, held = self.skip_at if self.n_skip > 0 else self.n_past
        if self.can_trim:
            while keep < n and keep < held and self.hist[keep] == toks[keep]:
                keep += 1
        if keep == 0 or not self._remove_from(keep):
            self._clear()
            return 0
        self.n_out = 0
        return keep

    def keep_prefix(self, tokens):
        """Keep what the KV cache holds of ``tokens``' longest common prefix with the
        tokens decoded into it, drop everything after; returns how many were kept (0 when
        the model's memory cannot be trimmed: recurrent or sliding-window models)."""
        self._check()
        cdef int n = len(tokens), i
        cdef ll.llama_token * buf = <ll.llama_token *>malloc(max(n, 1) * sizeof(ll.llama_token))
        if buf == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                buf[i] = tokens[i]
            return self._keep_prefix(buf, n)
        finally:
            free(buf)

    def decode(self, tokens, *, logits="last"):
        """Append ``tokens`` to the sequence.  ``logits``: 'last', 'all' or 'none'.
        Afterwards ``get_logits(i)`` reads output row i (rows count the tokens that asked
        for logits, in order)."""
        self._check()
        cdef int n = len(tokens)
        if n == 0:
            raise ValueError("decode() needs at least one token")
        if self.n_past + n > self.n_ctx:
            raise ValueError(f"{n} tokens at position {self.n_past} do not fit the context of {self.n_ctx}")
        if logits == "last":
            lf = n - 1
        elif logits == "all":
            if n > self.n_batch:
                raise ValueError(f"logits='all' needs at most n_batch={self.n_batch} tokens")
            lf = 0
        elif logits == "none":
            lf = n
        else:
            raise ValueError("logits must be 'last', 'all' or 'none'")
        cdef ll.llama_token * buf = <ll.llama_token *>malloc(n * sizeof(ll.llama_token))
        cdef int i, rc, lfrom = lf
        try:
            for i in range(n):
                t = tokens[i]
                self.model._check_token(t)
                buf[i] = t
            with nogil:
                rc = self._decode(buf, n, lfrom)
        finally:
            free(buf)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")

    def get_logits(self, int i=-1):
        """A copy of output row ``i`` of the last decode as a float32 numpy array."""
        self._check()
        import numpy as np
        if i < 0:
            i += self.n_out
        if i < 0 or i >= self.n_out:
            raise IndexError(f"the last decode has {self.n_out} output rows")
        cdef float * p = self._logits(i)
        if p == NULL:
            raise RuntimeError("no logits for that row")
        out = np.empty(self.model.n_vocab, dtype=np.float32)
        cdef float[::1] view = out
        memcpy(&view[0], p, self.model.n_vocab * sizeof(float))
        return out

    def remove_from(self, int pos):
        """Remove the KV-cache entries at positions >= pos (the tail of the sequence)."""
        self._check()
        if pos < 0:
            raise ValueError("pos must be >= 0")
        if not self._remove_from(pos):
            raise RuntimeError("this model's memory cannot drop a partial sequence (recurrent model?)")

    def clear(self):
        """Empty the KV cache."""
        self._check()
        self._clear()

    cdef void _clear(self) noexcept nogil:
        ll.llama_memory_clear(ll.llama_get_memory(self.ptr), True)
        self.n_past = 0
        self.n_skip = 0
        self.n_out = 0

    def set_threads(self, int n_threads):
        self._check()
        if n_threads < 1:
            raise ValueError("n_threads must be at least 1")
        ll.llama_set_n_threads(self.ptr, n_threads, n_threads)
        self.n_threads = n_threads


def default_threads():
    """Threads used when none are given: the cores this process may run on (at most 8 on
    big machines, where more threads stop helping a single sequence)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 4
    return max(1, min(n, 8))
