# Suffix speculation across generations (after SuffixDecoding, Oliaro et al.): a generalized
# suffix automaton over a decoder's earlier documents (prompt + output of past generations),
# with occurrence counts.  The proposer follows the longest suffix of the current sequence
# that occurs in the corpus (at most max_match tokens, at least min_match) and proposes the
# most frequent continuation, greedily, each token with confidence count(child)/count(node)
# (shrunk for short matches: count(child) / (count(node) + 2 / matched length)).
# Documents are separate: no match runs across a document boundary.  Adding a document of n
# tokens builds its states in O(n) amortized, then refreshes the counts in one linear pass
# over the automaton.  Included into _core.pyx; matching and proposing run without the GIL.

cdef class SuffixIndex:
    """Suffix automaton over documents of token ids (``SuffixIndex(n_vocab)``).

    Use ``fastspec.corpus.SuffixCorpus`` (which keeps the documents, bounds the size and saves
    them); this is its compiled index."""
    cdef readonly int n_vocab
    cdef int32_t * slen              # state -> length of its longest string
    cdef int32_t * slink             # state -> suffix link (-1 for the root)
    cdef int32_t * sedge             # state -> first outgoing edge (-1: none); root uses root_next
    cdef int32_t * send              # state -> number of document prefixes ending exactly here
    cdef int32_t * scnt              # state -> occurrences of its strings (after _refresh)
    cdef int n_states, cap_states
    cdef int32_t * etok
    cdef int32_t * eto
    cdef int32_t * enext
    cdef int n_edges, cap_edges
    cdef int32_t * root_next         # dense transitions of the root
    cdef readonly int64_t n_tokens
    cdef readonly int n_docs
    cdef readonly int64_t version    # bumped on every change (proposers re-match)
    cdef int max_len

    def __cinit__(self, int n_vocab):
        if n_vocab < 1:
            raise ValueError(f"n_vocab must be >= 1, got {n_vocab}")
        self.n_vocab = n_vocab
        self.slen = self.slink = self.sedge = self.send = self.scnt = NULL
        self.etok = self.eto = self.enext = NULL
        self.root_next = <int32_t *>malloc(n_vocab * sizeof(int32_t))
        if self.root_next == NULL:
            raise MemoryError()
        self.cap_states = 0
        self.cap_edges = 0
        if self._reset() != 0:
            raise MemoryError()

    def __dealloc__(self):
        self._free_arrays()
        free(self.root_next)

    cdef void _free_arrays(self) noexcept nogil:
        free(self.slen); free(self.slink); free(self.sedge); free(self.send); free(self.scnt)
        free(self.etok); free(self.eto); free(self.enext)
        self.slen = self.slink = self.sedge = self.send = self.scnt = NULL
        self.etok = self.eto = self.enext = NULL
        self.cap_states = 0
        self.cap_edges = 0

    cdef int _reset(self) noexcept nogil:
        self._free_arrays()
        if self._grow_states(64) != 0 or self._grow_edges(64) != 0:
            return -1
        memset(self.root_next, 0xff, self.n_vocab * sizeof(int32_t))
        self.n_states = 1
        self.slen[0] = 0
        self.slink[0] = -1
        self.sedge[0] = -1
        self.send[0] = 0
        self.scnt[0] = 0
        self.n_edges = 0
        self.n_tokens = 0
        self.n_docs = 0
        self.max_len = 0
        self.version += 1
        return 0

    cdef int _grow_states(self, int need) noexcept nogil:
        if need <= self.cap_states:
            return 0
        cdef int64_t cap = self.cap_states if self.cap_states > 0 else 64
        while cap < need:
            cap *= 2
        if cap > 0x7fffffff:
            return -1
        cdef int32_t ** arrs[5]
        arrs[0] = &self.slen; arrs[1] = &self.slink; arrs[2] = &self.sedge
        arrs[3] = &self.send; arrs[4] = &self.scnt
        cdef int i
        cdef int32_t * p
        for i in range(5):
            p = <int32_t *>realloc(arrs[i][0], cap * sizeof(int32_t))
            if p == NULL:
                return -1
            arrs[i][0] = p
        self.cap_states = <int>cap
        return 0

    cdef int _grow_edges(self, int need) noexcept nogil:
        if need <= self.cap_edges:
            return 0
        cdef int64_t cap = self.cap_edges if self.cap_edges > 0 else 64
        while cap < need:
            cap *= 2
        if cap > 0x7fffffff:
            return -1
        cdef int32_t ** arrs[3]
        arrs[0] = &self.etok; arrs[1] = &self.eto; arrs[2] = &self.enext
        cdef int i
        cdef int32_t * p
        for i in range(3):
            p = <int32_t *>realloc(arrs[i][0], cap * sizeof(int32_t))
            if p == NULL:
                return -1
            arrs[i][0] = p
        self.cap_edges = <int>cap
        return 0

    cdef inline int _next(self, int v, int32_t c) noexcept nogil:
        if v == 0:
            return self.root_next[c]
        cdef int e = self.sedge[v]
        while e >= 0:
            if self.etok[e] == c:
                return self.eto[e]
            e = self.enext[e]
        return -1

    cdef int _set_next(self, int v, int32_t c, int to) noexcept nogil:
        if v == 0:
            self.root_next[c] = to
            return 0
        cdef int e = self.sedge[v]
        while e >= 0:
            if self.etok[e] == c:
                self.eto[e] = to
                return 0
            e = self.enext[e]
        if self._grow_edges(self.n_edges + 1) != 0:
            return -1
        e = self.n_edges
        self.n_edges += 1
        self.etok[e] = c
        self.eto[e] = to
        self.enext[e] = self.sedge[v]
        self.sedge[v] = e
        return 0

    cdef int _new_state(self, int length, int link) noexcept nogil:
        if self._grow_states(self.n_states + 1) != 0:
            return -1
        cdef int s = self.n_states
        self.n_states += 1
        self.slen[s] = length
        self.slink[s] = link
        self.sedge[s] = -1
        self.send[s] = 0
        self.scnt[s] = 0
        if length > self.max_len:
            self.max_len = length
        return s

    cdef int _clone(self, int q, int length) noexcept nogil:
        cdef int cl = self._new_state(length, self.slink[q])
        if cl < 0:
            return -1
        cdef int e = self.sedge[q]
        while e >= 0:
            if self._set_next(cl, self.etok[e], self.eto[e]) != 0:
                return -1
            e = self.enext[e]
        return cl

    cdef int _extend(self, int last, int32_t c) noexcept nogil:
        """The state of (prefix ending at ``last``) + c; -1 when out of memory."""
        cdef int q = self._next(last, c)
        cdef int p, cl, cur
        if q >= 0:
            if self.slen[q] == self.slen[last] + 1:
                return q
            cl = self._clone(q, self.slen[last] + 1)
            if cl < 0:
                return -1
            p = last
            while p >= 0 and self._next(p, c) == q:
                if self._set_next(p, c, cl) != 0:
                    return -1
                p = self.slink[p]
            self.slink[q] = cl
            return cl
        cur = self._new_state(self.slen[last] + 1, 0)
        if cur < 0:
            return -1
        p = last
        while p >= 0 and self._next(p, c) < 0:
            if self._set_next(p, c, cur) != 0:
                return -1
            p = self.slink[p]
        if p < 0:
            self.slink[cur] = 0
            return cur
        q = self._next(p, c)
        if self.slen[p] + 1 == self.slen[q]:
            self.slink[cur] = q
            return cur
        cl = self._clone(q, self.slen[p] + 1)
        if cl < 0:
            return -1
        while p >= 0 and self._next(p, c) == q:
            if self._set_next(p, c, cl) != 0:
                return -1
            p = self.slink[p]
        self.slink[q] = cl
        self.slink[cur] = cl
        return cur

    cdef int _add(self, const int32_t * doc, int n) noexcept nogil:
        cdef int last = 0, i
        for i in range(n):
            last = self._extend(last, doc[i])
            if last < 0:
                return -1
            self.send[last] += 1
        self.n_tokens += n
        self.n_docs += 1
        return 0

    cdef int _refresh(self) noexcept nogil:
        """Occurrence counts: each state's own ends plus those of its suffix-link subtree."""
        cdef int n = self.n_states, i, v, L = self.max_len
        cdef int32_t * bucket = <int32_t *>calloc(L + 2, sizeof(int32_t))
        cdef int32_t * order = <int32_t *>malloc(max(n, 1) * sizeof(int32_t))
        if bucket == NULL or order == NULL:
            free(bucket)
            free(order)
            return -1
        for v in range(n):
            bucket[self.slen[v] + 1] += 1
        for i in range(1, L + 2):
            bucket[i] += bucket[i - 1]
        for v in range(n):
            order[bucket[self.slen[v]]] = v
            bucket[self.slen[v]] += 1
        for v in range(n):
            self.scnt[v] = self.send[v]
        for i in range(n - 1, 0, -1):
            v = order[i]
            if self.slink[v] >= 0:
                self.scnt[self.slink[v]] += self.scnt[v]
        free(bucket)
        free(order)
        self.version += 1
        return 0

    cdef inline int _step(self, int * v, int * l, int32_t c, int max_match) noexcept nogil:
        """Matching: extend the match (state v, length l) by token c."""
        cdef int s = v[0], t
        cdef int length = l[0]
        if c < 0 or c >= self.n_vocab:
            v[0] = 0
            l[0] = 0
            return 0
        while s != 0 and self._next(s, c) < 0:
            s = self.slink[s]
            length = self.slen[s]
        t = self._next(s, c)
        if t >= 0:
            s = t
            length += 1
            if length > max_match:
                length = max_match
                while self.slink[s] > 0 and self.slen[self.slink[s]] >= length:
                    s = self.slink[s]
        else:
            s = 0
            length = 0
        v[0] = s
        l[0] = length
        return 0

    cdef int _greedy(self, int s, int l, int cap, ll.llama_token * out, float * conf,
                     float min_prob) noexcept nogil:
        """From state s (matched length l), the most frequent next token, repeatedly (at most
        cap tokens, until the product of the confidences drops below min_prob).  Confidence:
        count(child) / (count(node) + 2 / matched length): one earlier occurrence after a
        2-token match is an even bet, after a 16-token match nearly certain."""
        cdef int n = 0, e, best, best_tok
        cdef int32_t total, bc, c
        cdef double chain = 1.0, p
        while n < cap and s > 0:
            total = self.scnt[s]
            if total <= 0:
                break
            e = self.sedge[s]
            best = -1
            best_tok = -1
            bc = 0
            while e >= 0:
                c = self.scnt[self.eto[e]]
                if c > bc or (c == bc and self.etok[e] < best_tok):
                    bc = c
                    best = self.eto[e]
                    best_tok = self.etok[e]
                e = self.enext[e]
            if best < 0:
                break
            p = <double>bc / (total + 2.0 / (l + n))
            out[n] = best_tok
            conf[n] = <float>p
            n += 1
            chain *= p
            if chain < min_prob:
                break
            s = best
        return n

    # -- Python API (used by fastspec.corpus) ----------------------------------
    cdef int32_t * _doc_buffer(self, doc, int * n_out) except NULL:
        cdef Py_ssize_t n = len(doc), i
        if n > 0x3fffffff:
            raise ValueError("document too long")
        cdef int32_t * buf = <int32_t *>malloc(max(n, 1) * sizeof(int32_t))
        if buf == NULL:
            raise MemoryError()
        cdef long long t
        try:
            for i in range(n):
                v = doc[i]
                if isinstance(v, bool) or not hasattr(v, "__index__"):
                    raise TypeError(f"token {i} is {type(v).__name__}, not an int token id")
                t = v.__index__()
                if t < 0 or t >= self.n_vocab:
                    raise ValueError(f"token {i} = {t} is outside the vocabulary (0..{self.n_vocab - 1})")
                buf[i] = <int32_t>t
        except BaseException:
            free(buf)
            raise
        n_out[0] = <int>n
        return buf

    def add_many(self, docs):
        """Add documents (sequences of token ids); all are checked before any is added."""
        cdef list bufs = []
        cdef list lens = []
        cdef int n, rc = 0
        cdef int32_t * b
        cdef Py_ssize_t i
        try:
            for d in docs:
                b = self._doc_buffer(d, &n)
                bufs.append(<size_t>b)
                lens.append(n)
            if self.n_tokens + sum(lens) >= 0x3fffffff:
                raise ValueError("the suffix index holds at most about 1e9 tokens")
            for i in range(len(bufs)):
                b = <int32_t *><size_t>bufs[i]
                n = lens[i]
                if n > 0:
                    with nogil:
                        rc = self._add(b, n)
                    if rc != 0:
                        break
            if rc == 0:
                rc = self._refresh()
            if rc != 0:
                self._reset()
                raise MemoryError("out of memory while adding to the suffix index (it was emptied)")
        finally:
            for p in bufs:
                free(<int32_t *><size_t>p)

    def swap(self, SuffixIndex other not None):
        """Exchange contents with ``other`` (same n_vocab): a rebuilt index takes this one's
        place without its proposers having to change."""
        if other.n_vocab != self.n_vocab:
            raise ValueError("both indexes must have the same n_vocab")
        self.slen, other.slen = other.slen, self.slen
        self.slink, other.slink = other.slink, self.slink
        self.sedge, other.sedge = other.sedge, self.sedge
        self.send, other.send = other.send, self.send
        self.scnt, other.scnt = other.scnt, self.scnt
        self.n_states, other.n_states = other.n_states, self.n_states
        self.cap_states, other.cap_states = other.cap_states, self.cap_states
        self.etok, other.etok = other.etok, self.etok
        self.eto, other.eto = other.eto, self.eto
        self.enext, other.enext = other.enext, self.enext
        self.n_edges, other.n_edges = other.n_edges, self.n_edges
        self.cap_edges, other.cap_edges = other.cap_edges, self.cap_edges
        self.root_next, other.root_next = other.root_next, self.root_next
        self.n_tokens, other.n_tokens = other.n_tokens, self.n_tokens
        self.n_docs, other.n_docs = other.n_docs, self.n_docs
        self.max_len, other.max_len = other.max_len, self.max_len
        cdef int64_t v = max(self.version, other.version) + 1
        self.version = v
        other.version = v

    def add(self, doc):
        """Add one document (a sequence of token ids)."""
        self.add_many([doc])

    def clear(self):
        if self._reset() != 0:
            raise MemoryError()

    @property
    def n_states(self):
        return self.n_states

    @property
    def nbytes(self):
        """Bytes held by the automaton."""
        return (5 * self.cap_states + 3 * self.cap_edges + self.n_vocab) * sizeof(int32_t)

    def count(self, tokens):
        """Occurrences of the token string ``tokens`` in the documents (0 if absent)."""
        cdef int v = 0, t
        for tok in tokens:
            t = tok
            if t < 0 or t >= self.n_vocab:
                return 0
            v = self._next(v, t)
            if v < 0:
                return 0
        return self.scnt[v] if v > 0 else self.n_tokens

    def match_length(self, seq, int max_match=1 << 30):
        """Length of the longest suffix of ``seq`` (at most max_match) found in the documents."""
        cdef int v = 0, l = 0
        for tok in seq:
            self._step(&v, &l, tok, max_match)
        return l


# A match that reaches a few tokens back into the prompt, at an answer's opening, is mostly
# the chat template's header (the same before every answer): it proposes how an earlier
# answer went on, whatever was asked.  Where a conversation's second answer reworks its
# first, that is right; where it answers something new, it fails from the first token
# (Spec-Bench's roleplay and stem second turns, traced).  Such proposals learn under a key
# of their own, apart from matches of the same length inside an answer.  A match reaching
# further into the prompt (the same question asked again) keeps its length's key.
cdef enum:
    SUFFIX_KEY_OPENING = 14       # past the length keys (_suffix_key: 0 .. 13)
    SUFFIX_OPENING_REACH = 8      # at most this many matched tokens of the prompt


SUFFIX_OPENING_KEY = SUFFIX_KEY_OPENING   # (for Python: tests)


cdef inline int _suffix_key(int l, int cnt) noexcept nogil:
    cdef int b
    if l <= 2:
        b = 0
    elif l <= 3:
        b = 1
    elif l <= 5:
        b = 2
    elif l <= 8:
        b = 3
    elif l <= 16:
        b = 4
    elif l <= 32:
        b = 5
    else:
        b = 6
    return b + (7 if cnt >= 2 else 0)


cdef class SuffixProposer(Proposer):
    """Proposes the most frequent continuation, in a SuffixIndex, of the longest suffix of the
    sequence found there (``SuffixProposer(index, max_match=32, min_match=2, max_tokens=0)``)."""
    cdef readonly SuffixIndex index
    cdef readonly int max_match
    cdef readonly int min_match
    cdef float min_prob               # stop proposing when the chain's probability drops below
    cdef int v, l                     # matched state and length
    cdef int seen
    cdef int n_prompt                 # the prompt's length (see SUFFIX_KEY_OPENING)
    cdef int64_t seen_version
    cdef readonly int64_t n_proposed
    cdef readonly int64_t n_verified
    cdef readonly int64_t n_accepted

    def __cinit__(self, SuffixIndex index not None, int max_match=32, int min_match=2,
                  double min_prob=0.02):
        if not (1 <= min_match <= max_match):
            raise ValueError(f"need 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.index = index
        self.source = SRC_SUFFIX
        self.costly = False
        self.max_match = max_match
        self.min_match = min_match
        self.min_prob = <float>min_prob
        self.v = 0
        self.l = 0
        self.seen = 0
        self.seen_version = -1

    cdef void _rematch(self, const ll.llama_token * seq, int seq_len) noexcept nogil:
        cdef int i = seq_len - self.max_match
        if i < 0:
            i = 0
        self.v = 0
        self.l = 0
        while i < seq_len:
            self.index._step(&self.v, &self.l, seq[i], self.max_match)
            i += 1
        self.seen = seq_len
        self.seen_version = self.index.version

    cdef int begin(self, const ll.llama_token * seq, int n_prompt) except -1:
        self.n_prompt = n_prompt
        self._rematch(seq, n_prompt)
        return 0

    cdef void extend(self, const ll.llama_token * seq, int seq_len) noexcept nogil:
        if self.seen_version != self.index.version or seq_len < self.seen:
            self._rematch(seq, seq_len)
            return
        cdef int i
        for i in range(self.seen, seq_len):
            self.index._step(&self.v, &self.l, seq[i], self.max_match)
        self.seen = seq_len

    cdef int propose(self, const ll.llama_token * seq, int seq_len, int cap,
                     ll.llama_token * out, float * conf, int * key) noexcept nogil:
        if seq_len != self.seen or self.seen_version != self.index.version:
            self.extend(seq, seq_len)
        key[0] = 0
        if self.l < self.min_match or self.v <= 0 or cap <= 0:
            return 0
        cdef int reach = self.l - (seq_len - self.n_prompt)    # matched tokens of the prompt
        if 0 < reach <= SUFFIX_OPENING_REACH:
            key[0] = SUFFIX_KEY_OPENING
        else:
            key[0] = _suffix_key(self.l, self.index.scnt[self.v])
        cdef int n = self.index._greedy(self.v, self.l, cap, out, conf, self.min_prob)
        self.n_proposed += n
        return n

    cdef void feedback(self, int n_verified, int n_accepted) noexcept nogil:
        self.n_verified += n_verified
        self.n_accepted += n_accepted

    @property
    def match_length(self):
        """Length of the current match (tokens)."""
        return self.l

    def py_begin(self, seq, int n_prompt=-1):
        return _py_begin(self, seq, n_prompt)

    def py_extend(self, seq):
        _py_extend(self, seq)

    def py_propose(self, seq, int cap):
        return _py_propose(self, seq, cap)

    def py_feedback(self, int n_verified, int n_accepted):
        self.feedback(n_verified, n_accepted)
