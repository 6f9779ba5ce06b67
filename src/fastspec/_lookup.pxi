# N-gram prompt lookup as a free proposer: the tokens that followed the latest earlier
# occurrence of the longest suffix (ngram_max down to ngram_min tokens) of the text so
# far.  Included into _core.pyx after _proposer.pxi and _ngram.pxi.

cdef enum:
    LOOKUP_KEY_CONTINUING = 7            # + n-gram length: a proposal continuing a copy just accepted
    LOOKUP_KEY_OPENING = 0               # a proposal for an answer's first token


cdef class LookupProposer(Proposer):
    """Proposes from an n-gram index of the sequence, updated as it grows.  The key
    under which the policy learns its acceptance is the matched n-gram length n (2..8),
    or 7 + n (9..15) when the proposal continues, from the very next position, a proposal
    whose tokens were all just accepted: a copy in progress (an edit reproducing its
    input) is right far more often than a fresh match, and its evidence is kept apart;
    or 0 for a proposal at an answer's first token, where the n-gram matched is the
    prompt's own end (in a conversation, the chat template's header before an earlier
    answer, whose opening it proposes: on Spec-Bench's second turns, wrong nearly always,
    while the same n-gram lengths elsewhere copy well)."""
    cdef NgramIndex ix
    cdef int n_indexed                   # seq[1:n_indexed] are in the index
    cdef int last_start                  # where the last proposal was read from (-1: none)
    cdef int expect_start                # where a continuing proposal would read (-1: none)
    cdef int n_prompt                    # the prompt's length: a proposal at it is an opening

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
        self.last_start = -1
        self.expect_start = -1

    def __dealloc__(self):
        ngram_free(&self.ix)

    cdef int begin(self, const ll.llama_token * seq, int n_prompt) except -1:
        ngram_clear(&self.ix)
        self.n_indexed = 1
        self.last_start = -1
        self.expect_start = -1
        self.n_prompt = n_prompt
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
        if seq_len == self.n_prompt:
            key[0] = LOOKUP_KEY_OPENING
        else:
            key[0] = n_match + LOOKUP_KEY_CONTINUING if start == self.expect_start else n_match
        self.last_start = start
        return n

    cdef void feedback(self, int n_verified, int n_accepted) noexcept nogil:
        # all kept: the target's own next token followed, so the copy goes on from there
        if n_verified > 0 and n_accepted == n_verified and self.last_start >= 0:
            self.expect_start = self.last_start + n_accepted + 1
        else:
            self.expect_start = -1
