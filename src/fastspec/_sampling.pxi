# Token distributions and sampling, shared by target-alone and speculative generation.
# Included into _core.pyx.  All of it runs without the GIL.
#
# A distribution is a dense float array over the vocabulary (zeros where a filter
# removed a token), built from logits in this order: temperature, top-k, top-p,
# min-p, renormalise.  Target and draft are shaped by the same function, so the
# speculative rule compares like with like.

cdef struct SamplingParams:
    float temperature     # 0 = greedy (argmax); the other fields are then ignored
    int top_k             # 0 = off
    float top_p           # 1 = off
    float min_p           # 0 = off

cdef struct ProbIdx:
    float p
    int32_t id


cdef inline uint64_t rng_next(uint64_t * s) noexcept nogil:
    # splitmix64: small, fast, and plenty for sampling
    s[0] += 0x9E3779B97F4A7C15ULL
    cdef uint64_t z = s[0]
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline double rng_uniform(uint64_t * s) noexcept nogil:
    """Uniform double in [0, 1)."""
    return <double>(rng_next(s) >> 11) * (1.0 / 9007199254740992.0)


cdef enum:
    MAX_LANES = 16      # independent running maxima in max_f32


cdef float max_f32(const float * x, int n) noexcept nogil:
    """The largest of x[0..n) (NaNs passed over; -3.4e38 for none).  MAX_LANES running
    maxima side by side, which the compiler turns into vector max instructions: a single
    running maximum is a chain of dependent compares (over the default target's 151,936
    logits, argmax and argmax_gap together took 207 us on the Zen 4 that way, 103 us so; on
    an H100, where a one-token pass takes 1.8 ms, the chain made the target alone ~6 %
    slower)."""
    cdef float m[MAX_LANES]
    cdef float mx = -3.4e38
    cdef int i = 0, l, n_full = n - n % MAX_LANES
    for l in range(MAX_LANES):
        m[l] = -3.4e38
    while i < n_full:
        for l in range(MAX_LANES):
            m[l] = x[i + l] if x[i + l] > m[l] else m[l]
        i += MAX_LANES
    for l in range(MAX_LANES):
        mx = m[l] if m[l] > mx else mx
    while i < n:
        mx = x[i] if x[i] > mx else mx
        i += 1
    return mx


cdef inline int first_index(const float * x, int n, float v) noexcept nogil:
    """The first i with x[i] == v (0 if none)."""
    cdef int i
    for i in range(n):
        if x[i] == v:
            return i
    return 0


cdef inline void keep_top2(float v, float * top, float * second) noexcept nogil:
    """Fold v into the largest two seen so far (a new maximum moves the old one down)."""
    if v > top[0]:
        second[0] = top[0]
        top[0] = v
    elif v > second[0]:
        second[0] = v


cdef int argmax(const float * x, int n) noexcept nogil:
    """The index of the largest of x[0..n), the first of equal maxima (0 if all are NaN)."""
    return first_index(x, n, max_f32(x, n))


cdef int argmax_gap(const float * x, int n, float * gap) noexcept nogil:
    """argmax(x, n), and in gap[0] how far the runner-up (the largest of the others, a tie
    included) is below it (0 for n = 1).  One pass keeps each lane's largest two (the value
    a new maximum displaces moves down to second), then a pass finds the index."""
    cdef float m1[MAX_LANES]
    cdef float m2[MAX_LANES]
    cdef float t, v, top = -3.4e38, second = -3.4e38
    cdef int i = 0, l, n_full = n - n % MAX_LANES
    for l in range(MAX_LANES):
        m1[l] = -3.4e38
        m2[l] = -3.4e38
    while i < n_full:
        for l in range(MAX_LANES):
            v = x[i + l]
            t = m1[l] if v > m1[l] else v          # what stays below this lane's maximum
            m1[l] = v if v > m1[l] else m1[l]
            m2[l] = t if t > m2[l] else m2[l]
        i += MAX_LANES
    for l in range(MAX_LANES):                      # the largest two of the lanes' pairs
        keep_top2(m1[l], &top, &second)
        keep_top2(m2[l], &top, &second)
    while i < n:
        keep_top2(x[i], &top, &second)
        i += 1
    gap[0] = top - second if n > 1 else 0.0
    return first_index(x, n, top)


def _argmax_f32(float[::1] x not None):
    """(argmax, argmax_gap's index and gap) of a float32 array: the loop's greedy pick,
    exposed for the tests."""
    cdef float gap = 0.0
    cdef int n = x.shape[0]
    if n == 0:
        raise ValueError("empty array")
    cdef int a = argmax(&x[0], n)
    cdef int b = argmax_gap(&x[0], n, &gap)
    return a, b, gap


# Logits more than this below the maximum add less than n * e^-30 (< 1e-7 of the softmax
# sum for any real vocabulary): only the others are exponentiated.
cdef float EXP_FLOOR = 30.0


cdef inline double exp_sum(const float * logits, int n, float m) noexcept nogil:
    """Sum of exp(logit - m) over logits[0..n), m their maximum (those below m - EXP_FLOOR
    left out)."""
    cdef int i
    cdef float floor = m - EXP_FLOOR
    cdef double s = 0.0
    for i in range(n):
        if logits[i] > floor:
            s += expf(logits[i] - m)
    return s


cdef float top_prob(const float * logits, int n) noexcept nogil:
    """Probability of the most likely token under softmax(logits) (temperature 1)."""
    return <float>(1.0 / exp_sum(logits, n, logits[argmax(logits, n)]))


cdef int _cmp_desc(const void * a, const void * b) noexcept nogil:
    cdef float pa = (<const ProbIdx *>a).p
    cdef float pb = (<const ProbIdx *>b).p
    if pa > pb:
        return -1
    if pa < pb:
        return 1
    return (<const ProbIdx *>a).id - (<const ProbIdx *>b).id


cdef extern from "stdlib.h" nogil:
    void qsort(void * base, size_t nmemb, size_t size, int (*compar)(const void *, const void *) noexcept nogil)


cdef float kth_largest(float * tmp, int n, int k) noexcept nogil:
    """The k-th largest value of tmp[0:n] (1-based k); reorders tmp (quickselect)."""
    cdef int lo = 0, hi = n - 1, i, j, target = k - 1
    cdef float pivot, t
    while lo < hi:
        pivot = tmp[(lo + hi) >> 1]
        i = lo
        j = hi
        while i <= j:
            while tmp[i] > pivot:
                i += 1
            while tmp[j] < pivot:
                j -= 1
            if i <= j:
                t = tmp[i]; tmp[i] = tmp[j]; tmp[j] = t
                i += 1
                j -= 1
        if target <= j:
            hi = j
        elif target >= i:
            lo = i
        else:
            break
    return tmp[target]


cdef float shape_probs(const float * logits, int n, const SamplingParams * sp,
                       float * out, ProbIdx * scratch) noexcept nogil:
    """Fill out[0:n] with the filtered, normalised distribution for ``logits``.
    ``scratch`` needs room for n items.  Returns the largest probability."""
    cdef int i, m, kept
    cdef float inv_t = 1.0 / sp.temperature
    cdef float mx = logits[argmax(logits, n)] * inv_t
    cdef double total = 0.0, cum, thr
    cdef float pmax, cut
    cdef float * tmp
    for i in range(n):
        out[i] = expf(logits[i] * inv_t - mx)
        total += out[i]
    for i in range(n):
        out[i] = <float>(out[i] / total)
    pmax = <float>(1.0 / total)
    # top-k: keep the k most likely (ties at the boundary are all kept)
    if sp.top_k > 0 and sp.top_k < n:
        tmp = <float *>scratch          # ProbIdx is 8 bytes: room for 2n floats
        memcpy(tmp, out, n * sizeof(float))
        cut = kth_largest(tmp, n, sp.top_k)
        for i in range(n):
            if out[i] < cut:
                out[i] = 0.0
    # top-p: the smallest set of most likely tokens whose mass reaches top_p.  Only
    # tokens at or above a threshold whose set already holds top_p of the mass can be
    # in it, so sort just those.
    if sp.top_p < 1.0:
        thr = pmax * 1e-3
        while True:
            m = 0
            cum = 0.0
            for i in range(n):
                if out[i] >= thr and out[i] > 0.0:
                    cum += out[i]
            if cum >= sp.top_p or thr < 1e-30:
                break
            thr *= 1e-3
        m = 0
        for i in range(n):
            if out[i] >= thr and out[i] > 0.0:
                scratch[m].p = out[i]
                scratch[m].id = i
                m += 1
        qsort(scratch, m, sizeof(ProbIdx), _cmp_desc)
        cum = 0.0
        kept = m
        for i in range(m):
            cum += scratch[i].p
            if cum >= sp.top_p:
                kept = i + 1
                break
        for i in range(n):
            out[i] = 0.0
        for i in range(kept):
            out[scratch[i].id] = scratch[i].p
    # min-p: drop tokens less likely than min_p times the most likely
    if sp.min_p > 0.0:
        cut = sp.min_p * pmax
        for i in range(n):
            if out[i] < cut:
                out[i] = 0.0
    total = 0.0
    for i in range(n):
        total += out[i]
    for i in range(n):
        out[i] = <float>(out[i] / total)
    return <float>(pmax / total) if pmax / total <= 1.0 else 1.0


cdef int sample_dense(const float * probs, int n, uint64_t * rng) noexcept nogil:
    """Draw a token from a (normalised or not) non-negative weight vector."""
    cdef int i, last = -1
    cdef double total = 0.0, u, acc = 0.0
    for i in range(n):
        total += probs[i]
    u = rng_uniform(rng) * total
    for i in range(n):
        if probs[i] > 0.0:
            acc += probs[i]
            last = i
            if u < acc:
                return i
    return last if last >= 0 else argmax(probs, n)
