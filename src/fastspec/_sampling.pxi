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


cdef extern from "_vecmath.h" nogil:
    # vector loops over a row of logits (AVX-512, AVX2 or NEON, chosen at run time; see the header)
    float fs_top2(const float * x, int n, float * second)
    int fs_find(const float * x, int n, float v)
    double fs_exp_sum(const float * x, int n, float inv_t, float m, float lo, float * out)
    double fs_cut_sum(float * v, int n, float cut)
    double fs_sum_above(const float * v, int n, float thr)
    void fs_scale(float * v, int n, float k)
    int fs_gather(const float * v, int n, float thr, float * vals, void * pairs)   # pairs: ProbIdx *
    int fs_vec_path()
    int fs_set_vec_path(int p)
    int fs_can_run(int p)
    int fs_path_best()

VEC_PATHS = ("scalar", "neon", "avx2", "avx512")   # fs_vec_path()'s values, by name


cdef inline float max_f32(const float * x, int n) noexcept nogil:
    """The largest of x[0..n) (NaNs passed over; -3.4e38 for none)."""
    return fs_top2(x, n, NULL)


cdef inline int argmax(const float * x, int n) noexcept nogil:
    """The index of the largest of x[0..n), the first of equal maxima (0 if all are NaN)."""
    return fs_find(x, n, fs_top2(x, n, NULL))


cdef inline int argmax_gap(const float * x, int n, float * gap) noexcept nogil:
    """argmax(x, n), and in gap[0] how far the runner-up (the largest of the others, a tie
    included) is below it (0 for n = 1)."""
    cdef float second = 0.0
    cdef float top = fs_top2(x, n, &second)
    gap[0] = top - second if n > 1 else 0.0
    return fs_find(x, n, top)


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
    return fs_exp_sum(logits, n, 1.0, m, -EXP_FLOOR, NULL)


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


# The k-th largest weight is looked for among the weights at or above a threshold, from
# KTH_THR0 of the largest down by KTH_STEP until k are there: a short list to select from
# instead of the vocabulary (the 40th of a real distribution sits far above the floor).
cdef float KTH_THR0 = 1e-2
cdef float KTH_STEP = 1e-2


cdef float kth_weight(const float * w, int n, int k, float * tmp) noexcept nogil:
    """The k-th largest of the weights w[0:n] (0.0 if fewer than k are above 0); ``tmp``
    needs room for n floats."""
    cdef int c
    cdef float thr = KTH_THR0
    while True:
        c = fs_gather(w, n, thr, tmp, NULL)
        if c >= k:
            return kth_largest(tmp, c, k)
        if thr < 1e-30:
            return 0.0
        thr *= KTH_STEP


cdef float shape_probs(const float * logits, int n, const SamplingParams * sp,
                       float * out, ProbIdx * scratch) noexcept nogil:
    """Fill out[0:n] with the filtered, normalised distribution for ``logits``.
    ``scratch`` needs room for n items.  Returns the largest probability.

    Worked in weights w = exp(logit / T - max): the most likely token's is 1 and p = w / W,
    W the sum of all, so each filter reads the weights as they are and one scaling at the
    end normalises what is kept.  Top-k keeps the k largest (ties at the boundary all kept),
    top-p then the smallest set of the most likely whose probability (of the whole, before
    top-k) reaches top_p, min-p those at least min_p times the most likely (as
    tests/test_sampling_distribution.py's numpy reference does)."""
    cdef int i, m, kept
    cdef float inv_t = 1.0 / sp.temperature
    cdef float mx = max_f32(logits, n) * inv_t
    cdef double total, left, cum, need, thr
    cdef float cut
    total = fs_exp_sum(logits, n, inv_t, mx, -EXP_FLOOR, out)
    if not total > 0.0:
        # no finite logits to weigh (all NaN or -inf, or +inf among them): the most likely id
        memset(out, 0, n * sizeof(float))
        out[argmax(logits, n)] = 1.0
        return 1.0
    left = total
    if sp.top_k > 0 and sp.top_k < n:
        cut = kth_weight(out, n, sp.top_k, <float *>scratch)   # ProbIdx is 8 bytes: room for 2n floats
        if cut > 0.0:
            left = fs_cut_sum(out, n, cut)
    if sp.top_p < 1.0:
        # only weights at or above a threshold whose set already holds top_p of the mass
        # can be in the nucleus: sort just those
        need = sp.top_p * total
        thr = 1e-3
        while True:
            cum = fs_sum_above(out, n, <float>thr)
            if cum >= need or thr < 1e-30:
                break
            thr *= 1e-3
        m = fs_gather(out, n, <float>thr, NULL, <void *>scratch)   # (C takes fs_pair *: same layout)
        qsort(scratch, m, sizeof(ProbIdx), _cmp_desc)
        cum = 0.0
        kept = m
        for i in range(m):
            cum += scratch[i].p
            if cum >= need:
                kept = i + 1
                break
        memset(out, 0, n * sizeof(float))
        left = 0.0
        for i in range(kept):
            out[scratch[i].id] = scratch[i].p
            left += scratch[i].p
    if sp.min_p > 0.0:
        left = fs_cut_sum(out, n, sp.min_p)      # the most likely weighs 1
        if not left > 0.0:
            # (min_p 1 where a compiler's fused multiply-subtract left the most likely at
            # a rounding under 1): the most likely alone
            out[argmax(logits, n)] = 1.0
            return 1.0
    fs_scale(out, n, <float>(1.0 / left))
    return <float>(1.0 / left) if left >= 1.0 else 1.0


def _vec_paths():
    """(the loops this machine runs, those it can be made to run), by name (for the tests)."""
    return VEC_PATHS[fs_vec_path()], [VEC_PATHS[p] for p in range(len(VEC_PATHS)) if fs_can_run(p)]


def _set_vec_path(name):
    """Make this process run the named loops (one of _vec_paths()[1]); for the tests."""
    if name not in VEC_PATHS or not fs_set_vec_path(VEC_PATHS.index(name)):
        raise ValueError(f"this machine cannot run the {name!r} loops")


def _exp_weights(float[::1] logits not None, float temperature=1.0):
    """(w, their sum): w = exp(logits / temperature - max), 0 below EXP_FLOOR; the loops
    shape_probs runs, exposed for the tests."""
    import numpy as np
    cdef int n = logits.shape[0]
    if n == 0 or not temperature > 0.0:
        raise ValueError("need logits and a temperature > 0")
    out = np.empty(n, dtype=np.float32)
    cdef float[::1] o = out
    cdef float inv_t = 1.0 / temperature
    cdef double s = fs_exp_sum(&logits[0], n, inv_t, max_f32(&logits[0], n) * inv_t, -EXP_FLOOR, &o[0])
    return out, s


def _shape_probs(float[::1] logits not None, float temperature, int top_k=0, float top_p=1.0, float min_p=0.0):
    """shape_probs over a row of logits, as a float32 array (for the tests)."""
    import numpy as np
    cdef int n = logits.shape[0]
    if n == 0 or not temperature > 0.0:
        raise ValueError("need logits and a temperature > 0")
    cdef SamplingParams sp
    sp.temperature = temperature
    sp.top_k = top_k
    sp.top_p = top_p
    sp.min_p = min_p
    out = np.empty(n, dtype=np.float32)
    cdef float[::1] o = out
    cdef ProbIdx * scratch = <ProbIdx *>malloc(n * sizeof(ProbIdx))
    if scratch == NULL:
        raise MemoryError()
    try:
        shape_probs(&logits[0], n, &sp, &o[0], scratch)
    finally:
        free(scratch)
    return out


cdef int sample_dense(const float * probs, int n, uint64_t * rng) noexcept nogil:
    """Draw a token from a (normalised or not) non-negative weight vector."""
    cdef int i, last = -1
    cdef double total = fs_sum_above(probs, n, 0.0), u, acc = 0.0
    u = rng_uniform(rng) * total
    for i in range(n):
        if probs[i] > 0.0:
            acc += probs[i]
            last = i
            if u < acc:
                return i
    return last if last >= 0 else argmax(probs, n)
