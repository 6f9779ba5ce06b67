# N-gram (prompt lookup) index: for each n in [n_min, n_max], the latest position at
# which each n-gram of the sequence was followed by a token.  Updated once per new
# token and queried once per step, in O(n_max) whatever the context length.
# Included into _core.pyx; runs without the GIL.

cdef enum:
    NGRAM_MAX_LEVELS = 8

cdef struct NgramIndex:
    uint64_t * keys          # 0 = empty slot
    int32_t * vals           # index of the token that followed the n-gram
    uint64_t mask
    int n_min
    int n_max


cdef int ngram_init(NgramIndex * ix, int n_tokens, int n_min, int n_max) noexcept nogil:
    cdef uint64_t size = 1024
    while size < <uint64_t>n_tokens * (n_max - n_min + 1) * 4:
        size <<= 1
    ix.keys = <uint64_t *>calloc(size, sizeof(uint64_t))
    ix.vals = <int32_t *>malloc(size * sizeof(int32_t))
    ix.mask = size - 1
    ix.n_min = n_min
    ix.n_max = n_max
    return 0 if (ix.keys != NULL and ix.vals != NULL) else -1


cdef void ngram_free(NgramIndex * ix) noexcept nogil:
    free(ix.keys)
    free(ix.vals)
    ix.keys = NULL
    ix.vals = NULL


cdef void ngram_clear(NgramIndex * ix) noexcept nogil:
    if ix.keys != NULL:
        memset(ix.keys, 0, (ix.mask + 1) * sizeof(uint64_t))


cdef inline uint64_t _ngram_hash(const ll.llama_token * seq, int end, int n) noexcept nogil:
    cdef uint64_t h = 0xcbf29ce484222325ULL ^ <uint64_t>n
    cdef int i
    for i in range(end - n, end):
        h = (h ^ <uint64_t><uint32_t>seq[i]) * 0x100000001b3ULL
        h ^= h >> 29
    return h | 1                                # never 0 (the empty marker)


cdef void ngram_add(NgramIndex * ix, const ll.llama_token * seq, int i) noexcept nogil:
    """seq[i] is now known: record it as the follower of the n-grams ending at i-1."""
    cdef int n
    cdef uint64_t h, slot
    for n in range(ix.n_min, ix.n_max + 1):
        if i - n < 0:
            break
        h = _ngram_hash(seq, i, n)
        slot = h & ix.mask
        while ix.keys[slot] != 0 and ix.keys[slot] != h:
            slot = (slot + 1) & ix.mask
        ix.keys[slot] = h
        ix.vals[slot] = i


cdef int ngram_find(NgramIndex * ix, const ll.llama_token * seq, int length, int * matched) noexcept nogil:
    """Index of the token that followed the latest earlier occurrence of the longest
    suffix n-gram of seq[0:length] (n from n_max down to n_min), or -1.  The n of the
    match goes to ``matched``."""
    cdef int n, v, i
    cdef uint64_t h, slot
    cdef bint same
    for n in range(ix.n_max, ix.n_min - 1, -1):
        if length < n:
            continue
        h = _ngram_hash(seq, length, n)
        slot = h & ix.mask
        while ix.keys[slot] != 0:
            if ix.keys[slot] == h:
                v = ix.vals[slot]
                if n <= v < length:
                    same = True
                    for i in range(n):
                        if seq[v - n + i] != seq[length - n + i]:
                            same = False
                            break
                    if same:
                        matched[0] = n
                        return v
                break
            slot = (slot + 1) & ix.mask
    return -1


def ngram_lookup_cost(tokens, int ngram_min=1, int ngram_max=4):
    """Time the n-gram index on a token sequence: index every token, and query the
    suffix after each one (what generation does per token).  Returns (seconds per
    token added, seconds per query, number of queries that found a proposal)."""
    cdef int n = len(tokens), i, found = 0, matched = 0
    if n < 2:
        raise ValueError("need at least 2 tokens")
    cdef ll.llama_token * seq = <ll.llama_token *>malloc(n * sizeof(ll.llama_token))
    cdef NgramIndex ix
    cdef int64_t t0, t_add = 0, t_find = 0
    if seq == NULL or ngram_init(&ix, n, ngram_min, ngram_max) != 0:
        free(seq)
        raise MemoryError()
    try:
        for i in range(n):
            seq[i] = tokens[i]
        with nogil:
            for i in range(1, n):
                t0 = ll.llama_time_us()
                ngram_add(&ix, seq, i)
                t_add += ll.llama_time_us() - t0
                t0 = ll.llama_time_us()
                if ngram_find(&ix, seq, i + 1, &matched) >= 0:
                    found += 1
                t_find += ll.llama_time_us() - t0
    finally:
        ngram_free(&ix)
        free(seq)
    return t_add * 1e-6 / (n - 1), t_find * 1e-6 / (n - 1), found


cdef enum:
    NGRAM_DEFAULT_MIN = 2
    NGRAM_DEFAULT_MAX = 8
