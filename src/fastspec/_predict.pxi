# Predicted outputs: the caller's expected output (e.g. the file being edited) as a free
# proposal source that stays aligned with the generation.  A cursor walks the prediction while
# the emitted tokens agree with it; after a mismatch it re-synchronises on the latest emitted
# n-gram (n = 4 down to 2, through a hash index built once; the occurrence nearest the last
# trusted position wins, before or after it), or on the single latest token within a few
# tokens after that position (a substituted word rejoins one token later).  It proposes
# prediction[cursor:cursor+cap] with a confidence that grows with the run of tokens accepted
# since it (re)aligned, and nothing while it is not aligned.  Included into _core.pyx; every
# per-token method runs without the GIL in O(1) (O(chain) on a re-synchronisation).

cdef enum:
    PRED_NG_MIN = 2
    PRED_NG_MAX = 4
    PRED_WINDOW = 8            # single-token rejoin: look this far after the trusted position
    PRED_TRUST_RUN = 4         # a run this long makes the cursor the trusted position
    PRED_MAX_CHAIN = 4096      # occurrences examined per n-gram on a re-synchronisation


cdef inline uint64_t _pred_hash(const ll.llama_token * t, int n) noexcept nogil:
    cdef uint64_t h = 0x9e3779b97f4a7c15ULL ^ (<uint64_t>n * 0xff51afd7ed558ccdULL)
    cdef int i
    for i in range(n):
        h = (h ^ <uint64_t><uint32_t>t[i]) * 0x100000001b3ULL
        h ^= h >> 31
    return h | 1


cdef inline int _pred_run_key(int run, int sync_n) noexcept nogil:
    if run == 0:
        return 0 if sync_n == 1 else 1
    if run < 4:
        return 2
    if run < 16:
        return 3
    if run < 64:
        return 4
    return 5


cdef class PredictionProposer(Proposer):
    """Proposes the caller's predicted output, kept aligned with what is generated.

    ``PredictionProposer(token_ids, n_vocab=None)``: ``token_ids`` a non-empty sequence of
    ints (checked against ``n_vocab`` when given).  The Python methods ``py_begin``,
    ``py_extend``, ``py_propose`` and ``py_feedback`` drive it from token lists (tests)."""
    cdef ll.llama_token * pred
    cdef int m
    cdef uint64_t * hkeys            # hash table: n-gram hash -> latest end position
    cdef int32_t * hvals
    cdef uint64_t hmask
    cdef int32_t * chain             # chain[(n - PRED_NG_MIN) * (m + 1) + e]: previous end with the same hash
    cdef int cursor                  # next prediction index expected
    cdef int anchor                  # last trusted cursor (reference for re-synchronisation)
    cdef bint aligned
    cdef int run                     # tokens matched since the last (re)alignment
    cdef int sync_n                  # n-gram length of the last re-synchronisation (0: start)
    cdef int seen                    # seq tokens already processed
    cdef int n_prompt
    cdef readonly int64_t n_resyncs
    cdef readonly int64_t n_mismatches
    cdef readonly int64_t n_proposed
    cdef readonly int64_t n_verified
    cdef readonly int64_t n_accepted

    def __cinit__(self, token_ids, n_vocab=None):
        self.pred = NULL
        self.hkeys = NULL
        self.hvals = NULL
        self.chain = NULL
        self.source = SRC_PREDICTION
        self.costly = False
        if isinstance(token_ids, (str, bytes, bytearray)) or not hasattr(token_ids, "__len__"):
            raise TypeError("prediction must be a sequence of token ids (a list of int)")
        cdef Py_ssize_t m = len(token_ids)
        if m == 0:
            raise ValueError("prediction is empty")
        if m > 0x3fffffff:
            raise ValueError(f"prediction of {m} tokens is too long (at most {0x3fffffff})")
        self.m = <int>m
        self.pred = <ll.llama_token *>malloc(m * sizeof(ll.llama_token))
        if self.pred == NULL:
            raise MemoryError()
        cdef int i
        cdef long long t
        for i in range(self.m):
            v = token_ids[i]
            if isinstance(v, bool) or not hasattr(v, "__index__"):
                raise TypeError(f"prediction token {i} is {type(v).__name__}, not an int token id")
            t = v.__index__()
            if t < 0 or (n_vocab is not None and t >= n_vocab) or t > 0x7fffffff:
                lim = f"0..{n_vocab - 1}" if n_vocab is not None else "0.."
                raise ValueError(f"prediction token {i} = {t} is outside the vocabulary ({lim}); "
                                 "was it tokenized with another model?")
            self.pred[i] = <ll.llama_token>t
        if self._build_index() != 0:
            raise MemoryError()
        self._reset(0)

    def __dealloc__(self):
        free(self.pred)
        free(self.hkeys)
        free(self.hvals)
        free(self.chain)

    cdef int _build_index(self) noexcept nogil:
        cdef int levels = PRED_NG_MAX - PRED_NG_MIN + 1
        cdef uint64_t size = 64
        while size < <uint64_t>(self.m + 1) * levels * 2:
            size <<= 1
        self.hkeys = <uint64_t *>calloc(size, sizeof(uint64_t))
        self.hvals = <int32_t *>malloc(size * sizeof(int32_t))
        self.chain = <int32_t *>malloc(<size_t>(self.m + 1) * levels * sizeof(int32_t))
        if self.hkeys == NULL or self.hvals == NULL or self.chain == NULL:
            return -1
        self.hmask = size - 1
        cdef int n, e
        cdef uint64_t h, slot
        for n in range(PRED_NG_MIN, PRED_NG_MAX + 1):
            for e in range(n, self.m + 1):
                h = _pred_hash(self.pred + e - n, n)
                slot = h & self.hmask
                while self.hkeys[slot] != 0 and self.hkeys[slot] != h:
                    slot = (slot + 1) & self.hmask
                if self.hkeys[slot] == h:
                    self.chain[(n - PRED_NG_MIN) * (self.m + 1) + e] = self.hvals[slot]
                else:
                    self.hkeys[slot] = h
                    self.chain[(n - PRED_NG_MIN) * (self.m + 1) + e] = -1
                self.hvals[slot] = e
        return 0

    @property
    def n_tokens(self):
        return self.m

    @property
    def cursor_position(self):
        """The prediction index proposed next, or None while not aligned."""
        return self.cursor if self.aligned else None

    cdef void _reset(self, int n_prompt) noexcept nogil:
        self.cursor = 0
        self.anchor = 0
        self.aligned = True
        self.run = 0
        self.sync_n = 0
        self.seen = n_prompt
        self.n_prompt = n_prompt

    cdef int begin(self, const ll.llama_token * seq, int n_prompt) except -1:
        self._reset(n_prompt)
        return 0

    cdef bint _resync(self, const ll.llama_token * seq, int seq_len) noexcept nogil:
        """Find where the output's latest tokens occur in the prediction; True if found."""
        cdef int n, e, steps, after, before, j, i
        cdef uint64_t h, slot
        cdef int ref = self.anchor
        cdef bint same
        cdef ll.llama_token last
        for n in range(PRED_NG_MAX, PRED_NG_MIN - 1, -1):
            if seq_len < n:
                continue
            h = _pred_hash(seq + seq_len - n, n)
            slot = h & self.hmask
            while self.hkeys[slot] != 0 and self.hkeys[slot] != h:
                slot = (slot + 1) & self.hmask
            if self.hkeys[slot] == 0:
                continue
            e = self.hvals[slot]
            after = -1
            before = -1
            steps = 0
            while e >= 0 and steps < PRED_MAX_CHAIN:     # ends in decreasing order
                steps += 1
                same = True
                for i in range(n):
                    if self.pred[e - n + i] != seq[seq_len - n + i]:
                        same = False
                        break
                if same:
                    if e >= ref:
                        after = e
                    else:
                        before = e
                        break
                e = self.chain[(n - PRED_NG_MIN) * (self.m + 1) + e]
            if after < 0 and before < 0:
                continue
            if after < 0 or (before >= 0 and 2 * (ref - before) < after - ref):
                after = before
            self.cursor = after
            self.aligned = True
            self.run = 0
            self.sync_n = n
            self.n_resyncs += 1
            return True
        # a substituted token: the latest token a little after the trusted position
        if seq_len >= 1:
            last = seq[seq_len - 1]
            for j in range(ref, min(ref + PRED_WINDOW, self.m)):
                if self.pred[j] == last:
                    self.cursor = j + 1
                    self.aligned = True
                    self.run = 0
                    self.sync_n = 1
                    self.n_resyncs += 1
                    return True
        return False

    cdef void extend(self, const ll.llama_token * seq, int seq_len) noexcept nogil:
        cdef int i
        if seq_len < self.seen:             # the sequence shrank: start over from its end
            self.seen = seq_len
            self.aligned = False
            self.run = 0
            return
        for i in range(self.seen, seq_len):
            if self.aligned and self.cursor < self.m and seq[i] == self.pred[self.cursor]:
                self.cursor += 1
                self.run += 1
                if self.run >= PRED_TRUST_RUN:
                    self.anchor = self.cursor
                continue
            if self.aligned:
                self.n_mismatches += 1
                if self.anchor < self.cursor and (self.sync_n != 1 or self.run >= 2):
                    self.anchor = self.cursor
                self.aligned = False
                self.run = 0
            self._resync(seq, i + 1)
        self.seen = seq_len

    cdef int propose(self, const ll.llama_token * seq, int seq_len, int cap,
                     ll.llama_token * out, float * conf, int * key) noexcept nogil:
        if seq_len != self.seen:
            self.extend(seq, seq_len)
        key[0] = 0
        if not self.aligned or cap <= 0 or self.cursor >= self.m:
            return 0
        cdef int n = self.m - self.cursor
        if n > cap:
            n = cap
        cdef int j
        cdef float p
        if self.run == 0:
            p = 0.3 if self.sync_n == 1 else 0.5
        else:
            p = (self.run + 1.0) / (self.run + 2.0)
            if p > 0.99:
                p = 0.99
        memcpy(out, self.pred + self.cursor, n * sizeof(ll.llama_token))
        for j in range(n):
            conf[j] = p
        key[0] = _pred_run_key(self.run, self.sync_n)
        self.n_proposed += n
        return n

    cdef void feedback(self, int n_verified, int n_accepted) noexcept nogil:
        self.n_verified += n_verified
        self.n_accepted += n_accepted

    # -- Python drivers (tests, tools) --------------------------------------
    def py_begin(self, seq, int n_prompt=-1):
        return _py_begin(self, seq, n_prompt)

    def py_extend(self, seq):
        _py_extend(self, seq)

    def py_propose(self, seq, int cap):
        return _py_propose(self, seq, cap)

    def py_feedback(self, int n_verified, int n_accepted):
        self.feedback(n_verified, n_accepted)


# ---------------------------------------------------------------------------
# Python drivers shared by the proposers' test methods
# ---------------------------------------------------------------------------
cdef ll.llama_token * _ids_to_buffer(seq, int * n_out) except NULL:
    cdef Py_ssize_t n = len(seq)
    if n > 0x3fffffff:
        raise ValueError("sequence too long")
    cdef ll.llama_token * buf = <ll.llama_token *>malloc(max(n, 1) * sizeof(ll.llama_token))
    if buf == NULL:
        raise MemoryError()
    cdef Py_ssize_t i
    try:
        for i in range(n):
            buf[i] = seq[i]
    except BaseException:
        free(buf)
        raise
    n_out[0] = <int>n
    return buf


cdef _py_begin(Proposer p, seq, int n_prompt):
    cdef int n
    cdef ll.llama_token * buf = _ids_to_buffer(seq, &n)
    try:
        if n_prompt < 0 or n_prompt > n:
            n_prompt = n
        p.begin(buf, n_prompt)
    finally:
        free(buf)


cdef _py_extend(Proposer p, seq):
    cdef int n
    cdef ll.llama_token * buf = _ids_to_buffer(seq, &n)
    try:
        p.extend(buf, n)
    finally:
        free(buf)


cdef _py_propose(Proposer p, seq, int cap):
    """-> (tokens, confidences, key)"""
    if cap < 0:
        raise ValueError("cap must be >= 0")
    cdef int n, k, key = 0, j
    cdef ll.llama_token * buf = _ids_to_buffer(seq, &n)
    cdef ll.llama_token * out = <ll.llama_token *>malloc(max(cap, 1) * sizeof(ll.llama_token))
    cdef float * conf = <float *>malloc(max(cap, 1) * sizeof(float))
    try:
        if out == NULL or conf == NULL:
            raise MemoryError()
        k = p.propose(buf, n, cap, out, conf, &key)
        return [out[j] for j in range(k)], [conf[j] for j in range(k)], key
    finally:
        free(buf)
        free(out)
        free(conf)
