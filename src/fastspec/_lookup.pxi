# N-gram prompt lookup as a free proposer: the tokens that followed the latest earlier
# occurrence of the longest suffix (ngram_max down to ngram_min tokens) of the text so
# far.  Included into _core.pyx after _proposer.pxi and _ngram.pxi.

cdef class LookupProposer(Proposer):
    """Proposes from an n-gram index of the sequence, updated as it grows.  The key
    under which the policy learns its acceptance is the matched n-gram length."""
    cdef NgramIndex ix
    cdef int n_indexed                   # seq[1:n_indexed] are in the index

    def __cinit__(self, int n_tokens, int ngram_min=NGRAM_DEFAULT_MIN, int ngram_max=NGRAM_DEFAULT_MAX):
        self.source = SRC_LOOKUP
        self.ix.keys = NULL
        self.ix.vals = NULL
        if not (1 <= ngram_min <= ngram_max <= NGRAM_MAX_LEVELS):
            raise ValueError(f"need 1 <= ngram_min <= ngram_max <= {NGRAM_MAX_LEVELS}, "
                             f"got {ngram_min}..{ngram_max}")
        if n_tokens < 1:
            raise ValueError("n_tokens must be >= 1")
        if ngram_init(&self.ix, n_tokens, ngram_min, ngram_max) != 0:
            ngram_free(&self.ix)
            raise MemoryError()
        self.n_indexed = 1

    def __dealloc__(self):
        ngram_free(&self.ix)

    cdef int begin(self, const ll.llama_token * seq, int n_prompt) except -1:
        ngram_clear(&self.ix)
        self.n_indexed = 1
        self.extend(seq, n_prompt)
        return 0

    cdef void extend(self, const ll.llama_token * seq, int seq_len) noexcept nogil:
        cdef int i
        for i in range(self.n_indexed, seq_len):
            ngram_add(&self.ix, seq, i)
        if seq_len > self.n_indexed:
            self.n_indexed = seq_len

    cdef int propose(self, const ll.llama_token * seq, int seq_len, int cap,
                     ll.llama_token * out, float * conf, int * key) noexcept nogil:
        cdef int n_match = 0, j, n
        cdef int start = ngram_find(&self.ix, seq, seq_len, &n_match)
        if start < 0:
            return 0
        n = seq_len - start
        if n > cap:
            n = cap
        for j in range(n):
            out[j] = seq[start + j]
            conf[j] = -1.0
        key[0] = n_match
        return n
