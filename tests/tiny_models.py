"""Writers for tiny random-weight llama-architecture GGUF models, for unit tests.

The models are small enough to write in a few milliseconds and to load and run
with libllama on a CPU in well under a second.

Two vocabulary kinds are available, both independent of the weight seed, so
that two models of the same vocabulary kind always share an identical
vocabulary (a "draft" model for speculative decoding is simply the same kind
written with another seed):

``"bpe"``
    GPT-2 style byte-level BPE (``tokenizer.ggml.model = "gpt2"``,
    ``tokenizer.ggml.pre = "qwen2"``).  The 256 byte tokens in GPT-2's
    byte-to-unicode order come first, then the tokens produced by BPE merges
    learnt on a small fixed English text, then the control tokens
    ``<|bos|>``, ``<|eos|>``, ``<|im_start|>``, ``<|im_end|>``.  A ChatML chat
    template is stored, and ``<|im_end|>`` is the end-of-turn token.

    The "qwen2" pre-tokenizer is used (rather than "default"/"gpt-2"/
    "llama-bpe") because llama.cpp keeps ``clean_spaces`` off for it, so
    detokenisation is an exact inverse of tokenisation (with "default" or
    "gpt-2", text like ``"a , b"`` comes back as ``"a, b"``; "llama-bpe"
    additionally turns on ``ignore_merges``).

``"spm"``
    SentencePiece style (``tokenizer.ggml.model = "llama"``): ``<unk>``, ``<s>``,
    ``</s>``, the byte-fallback tokens ``<0x00>``..``<0xFF>``, single-character
    pieces for ``"▁"`` and printable ASCII, then multi-character pieces (with
    the ``"▁"`` word-boundary marker) learnt by BPE on the same fixed text,
    scored so that llama.cpp's SPM merging reproduces that segmentation.  No
    chat template is stored.

Public API: :func:`write_tiny_llama`, :func:`write_pair`, :func:`write_truncated`,
plus :func:`bpe_vocab` / :func:`spm_vocab` to inspect the vocabularies.
"""

from __future__ import annotations

import functools
import heapq
import os
import pathlib
import re
from dataclasses import dataclass

import numpy as np

import gguf

__all__ = [
    "write_tiny_llama",
    "write_pair",
    "write_truncated",
    "bpe_vocab",
    "spm_vocab",
    "Vocab",
    "CHATML_TEMPLATE",
]

# llama.cpp token types (enum llama_token_type / gguf.TokenType)
_NORMAL = int(gguf.TokenType.NORMAL)
_UNKNOWN = int(gguf.TokenType.UNKNOWN)
_CONTROL = int(gguf.TokenType.CONTROL)
_BYTE = int(gguf.TokenType.BYTE)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Fixed training text for the merges: plain English, so that common words
# ("hello", "world", "the", ...) become single tokens.  Changing it changes the
# vocabulary of every model written by this module.
_CORPUS = """
hello world. Hello World! hello, world? hello there, world.
The quick brown fox jumps over the lazy dog. The dog is not amused.
Once upon a time there was a little model that wanted to speak.
It read every book in the library and learned many new words.
This is a test of the speculative decoding engine. The draft model
proposes tokens and the target model verifies them in one batch.
What is the capital of France? The capital of France is Paris.
I think that we should go to the market and buy some bread and milk.
She said that she would come back tomorrow morning after school.
They have been working on this project for a long time, and it is
finally ready. We are happy with the results, but there is more to do.
Numbers like one two three four five six seven eight nine ten.
The sun is shining, the sky is blue, and the birds are singing.
Please write a short story about a cat who lives in a big city.
You can use this function to generate text from a prompt quickly.
def main(): return print("hello world")
if the answer is yes then we will continue, otherwise we stop here.
good morning good night thank you very much for your help today.
people time year way day thing man woman life child world school state
family student group country problem hand part place case week company
system program question work government number night point home water
room mother area money story fact month lot right study book eye job
word business issue side kind head house service friend father power
hour game line end member law car city community name president team
minute idea kid body information back parent face others level office
door health person art war history party result change morning reason
research girl guy moment air teacher force education
"""

# Pre-tokenisation used while learning merges (a simplified GPT-2 pattern: an
# optional leading space glued to a run of letters, single digits, runs of
# punctuation, runs of whitespace).  Merges never cross these chunks, so the
# result is valid under llama.cpp's real pre-tokenizer regex too.
_CHUNK_RE = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+|\s+")

_N_MERGES = 700


@dataclass(frozen=True)
class Vocab:
    kind: str
    tokens: tuple[str, ...]
    types: tuple[int, ...]
    scores: tuple[float, ...] | None
    merges: tuple[str, ...] | None
    bos: int
    eos: int
    unk: int | None
    eot: int | None
    pre: str | None
    chat_template: str | None

    def __len__(self) -> int:
        return len(self.tokens)

    def id(self, text: str) -> int:
        return self.tokens.index(text)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character mapping."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _learn_merges(chunks: dict[tuple[str, ...], int], n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE training on {symbol-tuple: frequency}.

    Ties in pair frequency are broken by the pair's text, so the result is fully
    deterministic (no dependence on hash seeds or dict ordering).
    """
    words = [list(w) for w in chunks]
    freqs = list(chunks.values())
    pair_count: dict[tuple[str, str], int] = {}
    pair_words: dict[tuple[str, str], set[int]] = {}

    def add_word(i: int, sign: int) -> None:
        w = words[i]
        for a, b in zip(w, w[1:]):
            p = (a, b)
            pair_count[p] = pair_count.get(p, 0) + sign * freqs[i]
            if sign > 0:
                pair_words.setdefault(p, set()).add(i)

    for i in range(len(words)):
        add_word(i, +1)

    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    while heap and len(merges) < n_merges:
        negc, p = heapq.heappop(heap)
        c = pair_count.get(p, 0)
        if c <= 0:
            continue
        if c != -negc:  # stale entry; re-queue with the current count
            heapq.heappush(heap, (-c, p))
            continue
        merges.append(p)
        a, b = p
        touched: set[tuple[str, str]] = set()
        for i in sorted(pair_words.pop(p, ())):
            w = words[i]
            if len(w) < 2:
                continue
            add_word(i, -1)
            out: list[str] = []
            j = 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(a + b)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            add_word(i, +1)
            touched.update(zip(out, out[1:]))
        pair_count.pop(p, None)
        for q in touched:
            if pair_count.get(q, 0) > 0:
                heapq.heappush(heap, (-pair_count[q], q))
    return merges


def _corpus_chunks(space: str, mapper=None) -> dict[tuple[str, ...], int]:
    counts: dict[tuple[str, ...], int] = {}
    for m in _CHUNK_RE.finditer(_CORPUS):
        s = m.group(0)
        if s.isspace():
            continue
        if mapper is not None:
            s = mapper(s)
        else:
            s = s.replace(" ", space)
        key = tuple(s)
        if len(key) >= 2:
            counts[key] = counts.get(key, 0) + 1
    # sort for a deterministic word order
    return dict(sorted(counts.items()))


@functools.lru_cache(maxsize=None)
def bpe_vocab() -> Vocab:
    """The fixed GPT-2 style byte-level BPE vocabulary."""
    b2u = _bytes_to_unicode()

    def mapper(s: str) -> str:
        return "".join(b2u[b] for b in s.encode("utf-8"))

    tokens: list[str] = [b2u[b] for b in range(256)]
    seen = set(tokens)
    merges = _learn_merges(_corpus_chunks("", mapper), _N_MERGES)
    for a, b in merges:
        t = a + b
        if t not in seen:
            seen.add(t)
            tokens.append(t)
    types = [_NORMAL] * len(tokens)
    specials = ["<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
    base = len(tokens)
    tokens += specials
    types += [_CONTROL] * len(specials)
    return Vocab(
        kind="bpe",
        tokens=tuple(tokens),
        types=tuple(types),
        scores=None,
        merges=tuple(f"{a} {b}" for a, b in merges),
        bos=base,
        eos=base + 1,
        unk=None,
        eot=base + 3,
        pre="qwen2",
        chat_template=CHATML_TEMPLATE,
    )


@functools.lru_cache(maxsize=None)
def spm_vocab() -> Vocab:
    """The fixed SentencePiece style vocabulary with byte fallback."""
    sp = "\u2581"  # "▁"
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [_UNKNOWN, _CONTROL, _CONTROL] + [_BYTE] * 256
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    merges = _learn_merges(_corpus_chunks(sp), _N_MERGES)
    pieces: list[str] = []
    seen: set[str] = set()
    for a, b in merges:
        t = a + b
        if t not in seen:
            seen.add(t)
            pieces.append(t)
    # SPM merging picks the adjacent pair whose union has the highest score;
    # score = -rank reproduces the learnt BPE order.
    for rank, t in enumerate(pieces):
        tokens.append(t)
        types.append(_NORMAL)
        scores.append(-float(rank))
    singles = [sp] + [chr(c) for c in range(0x21, 0x7F)]
    for k, t in enumerate(singles):
        tokens.append(t)
        types.append(_NORMAL)
        scores.append(-float(len(pieces) + k))
    return Vocab(
        kind="spm",
        tokens=tuple(tokens),
        types=tuple(types),
        scores=tuple(scores),
        merges=None,
        bos=1,
        eos=2,
        unk=0,
        eot=None,
        pre=None,
        chat_template=None,
    )


def _vocab(kind: str) -> Vocab:
    if kind == "bpe":
        return bpe_vocab()
    if kind == "spm":
        return spm_vocab()
    raise ValueError(f"unknown vocab kind {kind!r} (expected 'bpe' or 'spm')")


def write_tiny_llama(
    path,
    *,
    vocab: str = "bpe",
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx_train: int = 2048,
    dtype: str = "f32",
    out_std: float = 0.5,
) -> pathlib.Path:
    """Write a tiny random llama model to ``path`` and return it as a Path.

    The vocabulary depends only on ``vocab``; the weights only on ``seed`` and
    the shape arguments.  ``out_std`` is the standard deviation of
    ``output.weight``: the final RMS-normed hidden state has entries of about
    unit size, so logits have a spread of about ``out_std * sqrt(n_embd)``
    (4.0 with the defaults, which gives a handful of plausible next tokens).
    """
    if dtype not in ("f32", "f16"):
        raise ValueError(f"dtype must be 'f32' or 'f16', not {dtype!r}")
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must divide by n_head and n_head by n_head_kv")
    v = _vocab(vocab)
    n_vocab = len(v)
    head_dim = n_embd // n_head
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    rng = np.random.default_rng(seed)
    wdt = np.float32 if dtype == "f32" else np.float16

    def mat(rows: int, cols: int, std: float | None = None) -> np.ndarray:
        # numpy shape (rows, cols) == ggml ne {cols, rows}: cols is the input dim
        s = (1.0 / np.sqrt(cols)) if std is None else std
        return (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(s)).astype(wdt)

    def ones() -> np.ndarray:
        return np.ones(n_embd, dtype=np.float32)  # norms are always f32

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"tiny-llama-{vocab}-s{seed}")
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16))
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)

    w.add_tokenizer_model("gpt2" if v.kind == "bpe" else "llama")
    if v.pre is not None:
        w.add_tokenizer_pre(v.pre)
    w.add_token_list(list(v.tokens))
    w.add_token_types(list(v.types))
    if v.scores is not None:
        w.add_token_scores(list(v.scores))
    if v.merges is not None:
        w.add_token_merges(list(v.merges))
    w.add_bos_token_id(v.bos)
    w.add_eos_token_id(v.eos)
    if v.unk is not None:
        w.add_unk_token_id(v.unk)
    if v.eot is not None:
        w.add_eot_token_id(v.eot)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if v.chat_template is not None:
        w.add_chat_template(v.chat_template)

    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd, 1.0))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones())
        w.add_tensor(p + "attn_q.weight", mat(n_head * head_dim, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_head * head_dim))
        w.add_tensor(p + "ffn_norm.weight", ones())
        w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff))
    w.add_tensor("output_norm.weight", ones())
    w.add_tensor("output.weight", mat(n_vocab, n_embd, out_std))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_pair(tmpdir, vocab: str = "bpe") -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """Write (target, draft identical to target, draft with other weights).

    All three share the vocabulary.  The identical draft is a separate file
    with the same seed (so its outputs agree 100% with the target); the other
    draft uses a different seed (its greedy choices agree with the target's
    about 1/n_vocab of the time).
    """
    d = pathlib.Path(tmpdir)
    target = write_tiny_llama(d / f"target-{vocab}.gguf", vocab=vocab, seed=0)
    same = write_tiny_llama(d / f"draft-same-{vocab}.gguf", vocab=vocab, seed=0)
    other = write_tiny_llama(d / f"draft-other-{vocab}.gguf", vocab=vocab, seed=1)
    return target, same, other


def write_truncated(path_src, path_dst, keep_fraction: float = 0.5) -> pathlib.Path:
    """Copy the first ``keep_fraction`` of ``path_src``'s bytes to ``path_dst``."""
    if not 0.0 <= keep_fraction < 1.0:
        raise ValueError("keep_fraction must be in [0, 1)")
    data = pathlib.Path(path_src).read_bytes()
    dst = pathlib.Path(path_dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data[: int(len(data) * keep_fraction)])
    return dst


if __name__ == "__main__":  # pragma: no cover - manual inspection helper
    import sys
    import time

    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    for kind in ("bpe", "spm"):
        t0 = time.perf_counter()
        p = write_tiny_llama(out / f"tiny-{kind}.gguf", vocab=kind)
        print(p, len(_vocab(kind)), "tokens", f"{time.perf_counter() - t0:.3f}s", os.path.getsize(p), "bytes")
