"""A decoder's suffix corpus: earlier prompts and outputs, indexed for suffix speculation.

``SuffixCorpus`` keeps documents (token-id arrays) in arrival order, bounded by ``max_tokens``
(the oldest documents are dropped beyond it), and a compiled suffix automaton over them
(``fastspec._core.SuffixIndex``) from which ``SuffixProposer`` proposes the most frequent
continuation of the longest matching suffix.  It saves to and loads from a small binary file:

    magic  b"FASTSPEC-CORPUS\\n" (16 bytes)
    u32    format version (1)
    u32    header length H, then H bytes of JSON: fingerprint, n_vocab, n_docs, n_tokens
    u32    n_docs document lengths, then i32 n_tokens token ids (little-endian)
    32     SHA-256 of everything before it

The fingerprint identifies the vocabulary (a hash of the model's token texts), so a corpus saved
for one model is refused by another.  A corrupt file or one for another vocabulary raises
``ValueError`` and leaves the corpus it was loaded into as it was.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import tempfile
from array import array
from collections import deque

from . import _core

MAGIC = b"FASTSPEC-CORPUS\n"
VERSION = 1
DEFAULT_MAX_TOKENS = 1 << 18
_U32 = struct.Struct("<I")


def vocab_fingerprint(model) -> str:
    """A hash of ``model``'s vocabulary (type, size, special tokens and every token's text)."""
    h = hashlib.sha256()
    h.update(f"{model.vocab_type}|{model.n_vocab}|{model.bos}|{model.eos}|".encode())
    for t in range(model.n_vocab):
        h.update(model.token_text(t).encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return "vocab-sha256:" + h.hexdigest()


def _as_ids(doc, n_vocab: int, what: str) -> array:
    if isinstance(doc, (str, bytes, bytearray)) or not hasattr(doc, "__len__"):
        raise TypeError(f"{what} must be text or a sequence of token ids")
    out = array("i")
    for i, v in enumerate(doc):
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise TypeError(f"{what}: token {i} is {type(v).__name__}, not an int token id")
        t = v.__index__()
        if not 0 <= t < n_vocab:
            raise ValueError(f"{what}: token {i} = {t} is outside the vocabulary (0..{n_vocab - 1}); "
                             "was it tokenized with another model?")
        out.append(t)
    return out


class _HybridLoad:
    """``SuffixCorpus.load(path, model)`` makes a corpus; ``corpus.load(path)`` loads into one."""

    def __get__(self, obj, cls):
        if obj is None:
            def load(path, model=None, *, n_vocab=None, max_tokens=DEFAULT_MAX_TOKENS):
                c = cls(model, n_vocab=n_vocab, max_tokens=max_tokens)
                c._load_into(path)
                return c
            load.__doc__ = "Read a corpus saved by ``save`` for ``model``'s vocabulary."
            return load

        def load_into(path):
            obj._load_into(path)
            return obj
        load_into.__doc__ = "Replace this corpus's documents by those saved in ``path``."
        return load_into


class SuffixCorpus:
    """Documents of token ids for suffix speculation, for one model's vocabulary.

    ``SuffixCorpus(model, max_tokens=262144)``; without a model give ``n_vocab`` (documents
    must then be token ids).  ``add(text_or_ids)``, ``clear()``, ``save(path)``,
    ``SuffixCorpus.load(path, model)`` or ``corpus.load(path)``, ``len(corpus)`` (documents),
    ``n_tokens``, ``max_tokens``.  Memory: about 100 bytes per token held, plus 4 bytes per
    vocabulary entry."""

    load = _HybridLoad()

    def __init__(self, model=None, *, max_tokens: int = DEFAULT_MAX_TOKENS, n_vocab: int | None = None):
        if model is None and n_vocab is None:
            raise ValueError("SuffixCorpus needs a model (or n_vocab for token-id documents)")
        if model is not None:
            if n_vocab is not None and n_vocab != model.n_vocab:
                raise ValueError(f"n_vocab={n_vocab} does not match the model's {model.n_vocab}")
            n_vocab = model.n_vocab
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        if max_tokens >= 1 << 29:
            raise ValueError("max_tokens must be below 2**29")
        self._model = model
        self._n_vocab = int(n_vocab)
        self._max_tokens = max_tokens
        self._fingerprint = None
        self._docs: deque[array] = deque()
        self._n_tokens = 0
        self.index = _core.SuffixIndex(self._n_vocab)

    # -- description -----------------------------------------------------------
    def __len__(self) -> int:
        return len(self._docs)

    @property
    def n_tokens(self) -> int:
        return self._n_tokens

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def fingerprint(self) -> str:
        """Identifies the vocabulary this corpus is for (checked when loading)."""
        if self._fingerprint is None:
            self._fingerprint = (vocab_fingerprint(self._model) if self._model is not None
                                 else f"n_vocab:{self._n_vocab}")
        return self._fingerprint

    @property
    def documents(self) -> list[list[int]]:
        """Copies of the documents, oldest first."""
        return [d.tolist() for d in self._docs]

    def __repr__(self):
        return f"SuffixCorpus({len(self)} documents, {self._n_tokens}/{self._max_tokens} tokens)"

    # -- changes -----------------------------------------------------------------
    def add(self, doc) -> int:
        """Add one document: text (tokenized with the model, no special tokens) or token ids.
        Returns the number of tokens added (0 for an empty document, which is ignored).  A
        document longer than ``max_tokens`` keeps its last ``max_tokens`` tokens; beyond
        ``max_tokens`` in all, the oldest documents are dropped."""
        if isinstance(doc, str):
            if self._model is None:
                raise TypeError("this corpus has no model to tokenize text; add token ids")
            ids = array("i", self._model.tokenize(doc, add_special=False, parse_special=False))
        else:
            ids = _as_ids(doc, self._n_vocab, "document")
        if len(ids) == 0:
            return 0
        if len(ids) > self._max_tokens:
            ids = ids[len(ids) - self._max_tokens:]
        if self._n_tokens + len(ids) > self._max_tokens:
            docs = deque(self._docs)
            n = self._n_tokens + len(ids)
            while docs and n > self._max_tokens:
                n -= len(docs.popleft())
            docs.append(ids)
            self._replace(docs)
        else:
            self.index.add(ids)
            self._docs.append(ids)
            self._n_tokens += len(ids)
        return len(ids)

    def clear(self) -> None:
        """Forget every document."""
        self.index.clear()
        self._docs.clear()
        self._n_tokens = 0

    def _replace(self, docs) -> None:
        """Make ``docs`` the documents, building the new index before touching the old one."""
        index = _core.SuffixIndex(self._n_vocab)
        index.add_many(docs)
        self.index.swap(index)          # same object: proposers holding it see the new documents
        self._docs = deque(docs)
        self._n_tokens = sum(len(d) for d in docs)

    def proposer(self, *, max_match: int = 32, min_match: int = 2):
        """A compiled SuffixProposer over this corpus's current index."""
        return _core.SuffixProposer(self.index, max_match, min_match)

    # -- files -------------------------------------------------------------------------
    def save(self, path) -> None:
        """Write the documents to ``path`` (atomically: a complete file or the old one)."""
        path = os.fspath(path)
        header = json.dumps({"fingerprint": self.fingerprint, "n_vocab": self._n_vocab,
                             "n_docs": len(self._docs), "n_tokens": self._n_tokens}).encode()
        parts = [MAGIC, _U32.pack(VERSION), _U32.pack(len(header)), header]
        lens = array("I", [len(d) for d in self._docs])
        toks = array("i")
        for d in self._docs:
            toks.extend(d)
        if sys.byteorder != "little":
            lens.byteswap()
            toks.byteswap()
        parts += [lens.tobytes(), toks.tobytes()]
        body = b"".join(parts)
        data = body + hashlib.sha256(body).digest()
        d = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".corpus-", dir=d)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _load_into(self, path) -> None:
        path = os.fspath(path)
        with open(path, "rb") as f:
            data = f.read()

        def bad(why):
            return ValueError(f"{path} is not a usable fastspec corpus file: {why}")

        if len(data) < len(MAGIC) + 8 + 32 or not data.startswith(MAGIC):
            raise bad("bad magic (not a corpus file, or truncated)")
        body, digest = data[:-32], data[-32:]
        (version,) = _U32.unpack_from(body, len(MAGIC))
        if version != VERSION:
            raise bad(f"format version {version}, this fastspec reads version {VERSION}")
        if hashlib.sha256(body).digest() != digest:
            raise bad("checksum mismatch (corrupt or truncated)")
        (hlen,) = _U32.unpack_from(body, len(MAGIC) + 4)
        off = len(MAGIC) + 8
        try:
            header = json.loads(body[off:off + hlen].decode())
            fp, n_vocab = str(header["fingerprint"]), int(header["n_vocab"])
            n_docs, n_tokens = int(header["n_docs"]), int(header["n_tokens"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise bad(f"unreadable header ({e})") from None
        off += hlen
        if n_docs < 0 or n_tokens < 0 or len(body) != off + 4 * n_docs + 4 * n_tokens:
            raise bad("sizes do not match the header")
        if fp != self.fingerprint or n_vocab != self._n_vocab:
            raise ValueError(f"{path} was saved for another model's vocabulary "
                             f"({n_vocab} tokens, {fp[:28]}...) than this corpus's "
                             f"({self._n_vocab} tokens, {self.fingerprint[:28]}...)")
        lens = array("I")
        lens.frombytes(body[off:off + 4 * n_docs])
        toks = array("i")
        toks.frombytes(body[off + 4 * n_docs:])
        if sys.byteorder != "little":
            lens.byteswap()
            toks.byteswap()
        if sum(lens) != n_tokens:
            raise bad("document lengths do not add up to the token count")
        if n_tokens and (min(toks) < 0 or max(toks) >= self._n_vocab):
            raise bad("token ids outside the vocabulary")
        docs = deque()
        pos = 0
        for n in lens:
            docs.append(toks[pos:pos + n])
            pos += n
        total = n_tokens
        while docs and total > self._max_tokens:
            total -= len(docs.popleft())
        self._replace(docs)
