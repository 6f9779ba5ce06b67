/* Vector loops over a row of logits, for the distributions sampling shapes (_sampling.pxi)
 * and the draft model's confidence (_draft.pxi).
 *
 * A distribution over a 151,936-token vocabulary is an exponential a token, then sums and
 * scalings over all of them.  Written as plain C loops, compilers at -O2 leave them scalar
 * (libm's expf a call each, the double sum one dependent add after another): 1.1 ms for a
 * row at temperature 0.7, 2.0 ms with top-k 40, top-p 0.95 and min-p 0.05 on an Emerald
 * Rapids core -- paid for every row a speculative pass verifies and every token a draft
 * model samples.  These run them 8 or 16 at a time on x86 (AVX2 + FMA or AVX-512, chosen
 * at run time) and 4 at a time on 64-bit Arm (NEON); any other machine or compiler takes
 * the scalar loops with libm's expf.
 *
 * fs_exp_sum(x, n, inv_t, m, lo, out): out[i] = exp(x[i] * inv_t - m) where that exponent
 * is above ``lo`` (below it, and for NaN, 0), and returns their sum (out may be NULL: the
 * sum alone).  With m the largest x[i] * inv_t the exponents are <= 0 and the largest is
 * 1 (to a rounding where the compiler fuses the multiply and subtract).  The
 * vector exponential: x = k ln 2 + r with k = round(x / ln 2) and |r| <= ln 2 / 2 (ln 2 in
 * two parts, so that k ln 2 is exact), exp(r) by its Taylor polynomial of degree 7
 * (truncation error below 6e-9 relative), times 2^k built in the exponent bits; within
 * 1.2e-7 relative of libm's expf over [-30, 0].  Sums are kept in double, as the scalar
 * loop keeps them.
 * fs_cut_sum(v, n, cut): v[i] = 0 where v[i] < cut; returns the sum of what is left.
 * fs_sum_above(v, n, thr): the sum of the v[i] >= thr, v unchanged.
 * fs_scale(v, n, s): v[i] *= s.
 * fs_gather(v, n, thr, vals, pairs): the v[i] >= thr, in order, into vals[] (their values)
 * or pairs[] (value and index, fs_pair: the layout of _sampling.pxi's ProbIdx); returns how
 * many.  Few pass a threshold near the top of a distribution: a vector compare skips the rest.
 * fs_top2(x, n, second): the largest x[i] (NaNs passed over; -3.4e38 if none is larger), and
 * where second is not NULL the runner-up into *second (the largest of the others, a tie
 * with the largest included).  The same values whatever the path: each lane keeps its own
 * largest two and the lanes' pairs are merged at the end.
 * fs_find(x, n, v): the first i with x[i] == v (0 if none).  Together the greedy pick and
 * the target's certainty on it: in plain C at -O2, 94 us a row of the default target's
 * logits (a 1.8 ms one-token pass on an H100 checks 1-17 rows).
 * fs_vec_path(): the loops this machine runs (FS_PATH_*); fs_set_vec_path(p) forces one the
 * machine has, for tests (returns 0 if it cannot).
 */
#ifndef FASTSPEC_VECMATH_H
#define FASTSPEC_VECMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define FS_X86 1
#include <immintrin.h>
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define FS_NEON 1
#include <arm_neon.h>
#endif

#if defined(_MSC_VER) && !defined(__cplusplus)
#define FS_INLINE __inline
#else
#define FS_INLINE inline
#endif

enum { FS_PATH_SCALAR = 0, FS_PATH_NEON = 1, FS_PATH_AVX2 = 2, FS_PATH_AVX512 = 3 };

#define FS_LOG2E 1.44269504088896341f
#define FS_LN2_HI 0.693145751953125f        /* 16 significant bits: k * FS_LN2_HI is exact */
#define FS_LN2_LO 1.42860676533018704e-06f  /* ln 2 - FS_LN2_HI */
#define FS_C7 (1.0f / 5040.0f)
#define FS_C6 (1.0f / 720.0f)
#define FS_C5 (1.0f / 120.0f)
#define FS_C4 (1.0f / 24.0f)
#define FS_C3 (1.0f / 6.0f)
#define FS_C2 0.5f

/* ---- scalar ------------------------------------------------------------------------- */

static double fs_exp_sum_scalar(const float *x, int n, float inv_t, float m, float lo, float *out) {
    double s = 0.0;
    int i;
    for (i = 0; i < n; i++) {
        float v = x[i] * inv_t - m;
        float e = expf(v);
        e = v > lo ? e : 0.0f;        /* a select, not a branch: half a row may sit either side */
        if (out)
            out[i] = e;
        s += e;
    }
    return s;
}

static double fs_cut_sum_scalar(float *v, int n, float cut) {
    double s = 0.0;
    int i;
    for (i = 0; i < n; i++) {
        if (v[i] < cut)
            v[i] = 0.0f;
        s += v[i];
    }
    return s;
}

static double fs_sum_above_scalar(const float *v, int n, float thr) {
    double s = 0.0;
    int i;
    for (i = 0; i < n; i++)
        if (v[i] >= thr)
            s += v[i];
    return s;
}

static void fs_scale_scalar(float *v, int n, float k) {
    int i;
    for (i = 0; i < n; i++)
        v[i] *= k;
}

typedef struct { float p; int32_t id; } fs_pair;

static FS_INLINE int fs_put(const float *v, int i, float *vals, fs_pair *pairs, int c) {
    if (vals)
        vals[c] = v[i];
    else {
        pairs[c].p = v[i];
        pairs[c].id = i;
    }
    return c + 1;
}

static int fs_gather_scalar(const float *v, int n, float thr, float *vals, fs_pair *pairs) {
    int i, c = 0;
    for (i = 0; i < n; i++)
        if (v[i] >= thr)
            c = fs_put(v, i, vals, pairs, c);
    return c;
}

#define FS_LOWEST (-3.4e38f)   /* below every logit fs_top2 is asked about */

static FS_INLINE void fs_keep2(float v, float *top, float *second) {
    if (v > *top) {           /* a new maximum moves the old one down */
        *second = *top;
        *top = v;
    } else if (v > *second)
        *second = v;
}

/* Lanes' largest two (m1, m2, count each) merged into the row's (top, *second). */
static float fs_merge2(const float *m1, const float *m2, int lanes, float *second) {
    float top = FS_LOWEST, sec = FS_LOWEST;
    int l;
    for (l = 0; l < lanes; l++) {
        fs_keep2(m1[l], &top, &sec);
        if (m2)
            fs_keep2(m2[l], &top, &sec);
    }
    if (second)
        *second = sec;
    return top;
}

#define FS_LANES 16     /* side by side, so that compilers make vector compares of them */

static float fs_top2_scalar(const float *x, int n, float *second) {
    float m1[FS_LANES], m2[FS_LANES], top, sec, v, t;
    int i = 0, l, n_full = n - n % FS_LANES;
    for (l = 0; l < FS_LANES; l++)
        m1[l] = m2[l] = FS_LOWEST;
    if (second) {
        for (; i < n_full; i += FS_LANES)
            for (l = 0; l < FS_LANES; l++) {
                v = x[i + l];
                t = v > m1[l] ? m1[l] : v;        /* what stays below this lane's maximum */
                m1[l] = v > m1[l] ? v : m1[l];
                m2[l] = t > m2[l] ? t : m2[l];
            }
    } else {
        for (; i < n_full; i += FS_LANES)
            for (l = 0; l < FS_LANES; l++)
                m1[l] = x[i + l] > m1[l] ? x[i + l] : m1[l];
    }
    top = fs_merge2(m1, second ? m2 : NULL, FS_LANES, &sec);
    for (; i < n; i++)
        fs_keep2(x[i], &top, &sec);
    if (second)
        *second = sec;
    return top;
}

static int fs_find_scalar(const float *x, int n, float v) {
    int i;
    for (i = 0; i < n; i++)
        if (x[i] == v)
            return i;
    return 0;
}

/* ---- x86: AVX2 + FMA, AVX-512 ------------------------------------------------------- */
#if FS_X86

__attribute__((target("avx2,fma")))
static FS_INLINE __m256 fs_exp8(__m256 v, __m256 lo) {
    __m256 keep = _mm256_cmp_ps(v, lo, _CMP_GT_OQ);          /* NaN: false */
    __m256 k, r, p, s;
    v = _mm256_and_ps(v, keep);                               /* dropped lanes: exp(0) */
    k = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(FS_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(FS_LN2_HI), v);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(FS_LN2_LO), r);
    p = _mm256_set1_ps(FS_C7);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FS_C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FS_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FS_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FS_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FS_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    s = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23));
    return _mm256_and_ps(_mm256_mul_ps(p, s), keep);
}

__attribute__((target("avx2,fma")))
static FS_INLINE __m256d fs_add8_pd(__m256d acc, __m256 e) {
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    return _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
}

__attribute__((target("avx2,fma")))
static double fs_hsum4_pd(__m256d a) {
    double t[4];
    _mm256_storeu_pd(t, a);
    return (t[0] + t[1]) + (t[2] + t[3]);
}

__attribute__((target("avx2,fma")))
static double fs_exp_sum_avx2(const float *x, int n, float inv_t, float m, float lo, float *out) {
    const __m256 vt = _mm256_set1_ps(inv_t), vm = _mm256_set1_ps(m), vlo = _mm256_set1_ps(lo);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    double s;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 e0 = fs_exp8(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vt), vm), vlo);
        __m256 e1 = fs_exp8(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vt), vm), vlo);
        if (out) {
            _mm256_storeu_ps(out + i, e0);
            _mm256_storeu_ps(out + i + 8, e1);
        }
        s0 = fs_add8_pd(s0, e0);
        s1 = fs_add8_pd(s1, e1);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 e0 = fs_exp8(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vt), vm), vlo);
        if (out)
            _mm256_storeu_ps(out + i, e0);
        s0 = fs_add8_pd(s0, e0);
    }
    if (i < n) {            /* the last few through the same arithmetic, from a padded copy */
        float xb[8] = {0}, eb[8];
        __m256 e0;
        memcpy(xb, x + i, (size_t)(n - i) * sizeof(float));
        e0 = fs_exp8(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(xb), vt), vm), vlo);
        _mm256_storeu_ps(eb, e0);
        memset(eb + (n - i), 0, (size_t)(8 - (n - i)) * sizeof(float));
        if (out)
            memcpy(out + i, eb, (size_t)(n - i) * sizeof(float));
        s0 = fs_add8_pd(s0, _mm256_loadu_ps(eb));
    }
    s = fs_hsum4_pd(_mm256_add_pd(s0, s1));
    return s;
}

__attribute__((target("avx2,fma")))
static double fs_cut_sum_avx2(float *v, int n, float cut) {
    const __m256 c = _mm256_set1_ps(cut);
    __m256d s0 = _mm256_setzero_pd();
    double s;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(v + i);
        a = _mm256_and_ps(a, _mm256_cmp_ps(a, c, _CMP_GE_OQ));
        _mm256_storeu_ps(v + i, a);
        s0 = fs_add8_pd(s0, a);
    }
    s = fs_hsum4_pd(s0);
    for (; i < n; i++) {
        if (v[i] < cut)
            v[i] = 0.0f;
        s += v[i];
    }
    return s;
}

__attribute__((target("avx2,fma")))
static double fs_sum_above_avx2(const float *v, int n, float thr) {
    const __m256 c = _mm256_set1_ps(thr);
    __m256d s0 = _mm256_setzero_pd();
    double s;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(v + i);
        s0 = fs_add8_pd(s0, _mm256_and_ps(a, _mm256_cmp_ps(a, c, _CMP_GE_OQ)));
    }
    s = fs_hsum4_pd(s0);
    for (; i < n; i++)
        if (v[i] >= thr)
            s += v[i];
    return s;
}

__attribute__((target("avx2,fma")))
static void fs_scale_avx2(float *v, int n, float k) {
    const __m256 vk = _mm256_set1_ps(k);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(v + i, _mm256_mul_ps(_mm256_loadu_ps(v + i), vk));
    for (; i < n; i++)
        v[i] *= k;
}

__attribute__((target("avx2,fma")))
static int fs_gather_avx2(const float *v, int n, float thr, float *vals, fs_pair *pairs) {
    const __m256 c8 = _mm256_set1_ps(thr);
    int i = 0, c = 0, j;
    unsigned mask;
    for (; i + 8 <= n; i += 8) {
        mask = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i), c8, _CMP_GE_OQ));
        for (j = 0; mask; j++, mask >>= 1)
            if (mask & 1u)
                c = fs_put(v, i + j, vals, pairs, c);
    }
    for (; i < n; i++)
        if (v[i] >= thr)
            c = fs_put(v, i, vals, pairs, c);
    return c;
}

/* One step of a lane's largest two: v above p moves p down to q, else v may replace q. */
#define FS_KEEP2_256(v, p, q) do { \
        __m256 g_ = _mm256_cmp_ps(v, p, _CMP_GT_OQ); \
        q = _mm256_max_ps(_mm256_blendv_ps(v, p, g_), q);   /* NaN in the first: q */ \
        p = _mm256_blendv_ps(p, v, g_); \
    } while (0)

__attribute__((target("avx2,fma")))
static float fs_top2_avx2(const float *x, int n, float *second) {
    const __m256 lo = _mm256_set1_ps(FS_LOWEST);
    __m256 p0 = lo, p1 = lo, p2 = lo, p3 = lo, q0 = lo, q1 = lo, q2 = lo, q3 = lo;
    float m1[32], m2[32], top, sec;
    int i = 0;
    if (second) {
        for (; i + 32 <= n; i += 32) {
            FS_KEEP2_256(_mm256_loadu_ps(x + i), p0, q0);
            FS_KEEP2_256(_mm256_loadu_ps(x + i + 8), p1, q1);
            FS_KEEP2_256(_mm256_loadu_ps(x + i + 16), p2, q2);
            FS_KEEP2_256(_mm256_loadu_ps(x + i + 24), p3, q3);
        }
    } else {
        for (; i + 32 <= n; i += 32) {           /* max(v, p) is p where v is NaN */
            p0 = _mm256_max_ps(_mm256_loadu_ps(x + i), p0);
            p1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), p1);
            p2 = _mm256_max_ps(_mm256_loadu_ps(x + i + 16), p2);
            p3 = _mm256_max_ps(_mm256_loadu_ps(x + i + 24), p3);
        }
    }
    _mm256_storeu_ps(m1, p0); _mm256_storeu_ps(m1 + 8, p1);
    _mm256_storeu_ps(m1 + 16, p2); _mm256_storeu_ps(m1 + 24, p3);
    _mm256_storeu_ps(m2, q0); _mm256_storeu_ps(m2 + 8, q1);
    _mm256_storeu_ps(m2 + 16, q2); _mm256_storeu_ps(m2 + 24, q3);
    top = fs_merge2(m1, second ? m2 : NULL, 32, &sec);
    for (; i < n; i++)
        fs_keep2(x[i], &top, &sec);
    if (second)
        *second = sec;
    return top;
}

__attribute__((target("avx2,fma")))
static int fs_find_avx2(const float *x, int n, float v) {
    const __m256 vv = _mm256_set1_ps(v);
    int i = 0, mask;
    for (; i + 8 <= n; i += 8) {
        mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vv, _CMP_EQ_OQ));
        if (mask)
            return i + __builtin_ctz((unsigned)mask);
    }
    for (; i < n; i++)
        if (x[i] == v)
            return i;
    return 0;
}

__attribute__((target("avx512f")))
static FS_INLINE __m512 fs_exp16(__m512 v, __m512 lo) {
    __mmask16 keep = _mm512_cmp_ps_mask(v, lo, _CMP_GT_OQ);   /* NaN: false */
    __m512 k, r, p, s;
    v = _mm512_maskz_mov_ps(keep, v);
    k = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(FS_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(FS_LN2_HI), v);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(FS_LN2_LO), r);
    p = _mm512_set1_ps(FS_C7);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FS_C6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FS_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FS_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FS_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FS_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    s = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23));
    return _mm512_maskz_mul_ps(keep, p, s);
}

__attribute__((target("avx512f")))
static FS_INLINE __m512d fs_add16_pd(__m512d acc, __m512 e) {
    acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    return _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
}

__attribute__((target("avx512f")))
static double fs_hsum8_pd(__m512d a) {
    double t[8];
    _mm512_storeu_pd(t, a);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

__attribute__((target("avx512f")))
static double fs_exp_sum_avx512(const float *x, int n, float inv_t, float m, float lo, float *out) {
    const __m512 vt = _mm512_set1_ps(inv_t), vm = _mm512_set1_ps(m), vlo = _mm512_set1_ps(lo);
    __m512d s0 = _mm512_setzero_pd();
    __mmask16 tail;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = fs_exp16(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vt), vm), vlo);
        if (out)
            _mm512_storeu_ps(out + i, e);
        s0 = fs_add16_pd(s0, e);
    }
    if (i < n) {
        __m512 e;
        tail = (__mmask16)((1u << (n - i)) - 1u);
        e = fs_exp16(_mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + i), vt), vm), vlo);
        e = _mm512_maskz_mov_ps(tail, e);
        if (out)
            _mm512_mask_storeu_ps(out + i, tail, e);
        s0 = fs_add16_pd(s0, e);
    }
    return fs_hsum8_pd(s0);
}

__attribute__((target("avx512f")))
static double fs_cut_sum_avx512(float *v, int n, float cut) {
    const __m512 c = _mm512_set1_ps(cut);
    __m512d s0 = _mm512_setzero_pd();
    __mmask16 tail;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 a = _mm512_loadu_ps(v + i);
        a = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, c, _CMP_GE_OQ), a);
        _mm512_storeu_ps(v + i, a);
        s0 = fs_add16_pd(s0, a);
    }
    if (i < n) {
        __m512 a;
        tail = (__mmask16)((1u << (n - i)) - 1u);
        a = _mm512_maskz_loadu_ps(tail, v + i);
        a = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, c, _CMP_GE_OQ), a);
        _mm512_mask_storeu_ps(v + i, tail, a);
        s0 = fs_add16_pd(s0, a);
    }
    return fs_hsum8_pd(s0);
}

__attribute__((target("avx512f")))
static double fs_sum_above_avx512(const float *v, int n, float thr) {
    const __m512 c = _mm512_set1_ps(thr);
    __m512d s0 = _mm512_setzero_pd();
    __mmask16 tail;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 a = _mm512_loadu_ps(v + i);
        s0 = fs_add16_pd(s0, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, c, _CMP_GE_OQ), a));
    }
    if (i < n) {
        __m512 a;
        tail = (__mmask16)((1u << (n - i)) - 1u);
        a = _mm512_maskz_loadu_ps(tail, v + i);
        s0 = fs_add16_pd(s0, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, c, _CMP_GE_OQ) & tail, a));
    }
    return fs_hsum8_pd(s0);
}

__attribute__((target("avx512f")))
static void fs_scale_avx512(float *v, int n, float k) {
    const __m512 vk = _mm512_set1_ps(k);
    __mmask16 tail;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(v + i, _mm512_mul_ps(_mm512_loadu_ps(v + i), vk));
    if (i < n) {
        tail = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(v + i, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, v + i), vk));
    }
}

__attribute__((target("avx512f")))
static int fs_gather_avx512(const float *v, int n, float thr, float *vals, fs_pair *pairs) {
    const __m512 c16 = _mm512_set1_ps(thr);
    int i = 0, c = 0, j;
    unsigned mask;
    for (; i + 16 <= n; i += 16) {
        mask = (unsigned)_mm512_cmp_ps_mask(_mm512_loadu_ps(v + i), c16, _CMP_GE_OQ);
        for (j = 0; mask; j++, mask >>= 1)
            if (mask & 1u)
                c = fs_put(v, i + j, vals, pairs, c);
    }
    for (; i < n; i++)
        if (v[i] >= thr)
            c = fs_put(v, i, vals, pairs, c);
    return c;
}

#define FS_KEEP2_512(v, p, q) do { \
        __mmask16 g_ = _mm512_cmp_ps_mask(v, p, _CMP_GT_OQ); \
        q = _mm512_max_ps(_mm512_mask_blend_ps(g_, v, p), q); \
        p = _mm512_mask_blend_ps(g_, p, v); \
    } while (0)

__attribute__((target("avx512f")))
static float fs_top2_avx512(const float *x, int n, float *second) {
    const __m512 lo = _mm512_set1_ps(FS_LOWEST);
    __m512 p0 = lo, p1 = lo, p2 = lo, p3 = lo, q0 = lo, q1 = lo, q2 = lo, q3 = lo;
    float m1[64], m2[64];
    __mmask16 tail;
    int i = 0;
    if (second) {
        for (; i + 64 <= n; i += 64) {
            FS_KEEP2_512(_mm512_loadu_ps(x + i), p0, q0);
            FS_KEEP2_512(_mm512_loadu_ps(x + i + 16), p1, q1);
            FS_KEEP2_512(_mm512_loadu_ps(x + i + 32), p2, q2);
            FS_KEEP2_512(_mm512_loadu_ps(x + i + 48), p3, q3);
        }
        for (; i < n; i += 16) {                 /* lanes past the end read FS_LOWEST */
            tail = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
            FS_KEEP2_512(_mm512_mask_loadu_ps(lo, tail, x + i), p0, q0);
        }
    } else {
        for (; i + 64 <= n; i += 64) {
            p0 = _mm512_max_ps(_mm512_loadu_ps(x + i), p0);
            p1 = _mm512_max_ps(_mm512_loadu_ps(x + i + 16), p1);
            p2 = _mm512_max_ps(_mm512_loadu_ps(x + i + 32), p2);
            p3 = _mm512_max_ps(_mm512_loadu_ps(x + i + 48), p3);
        }
        for (; i < n; i += 16) {
            tail = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
            p0 = _mm512_max_ps(_mm512_mask_loadu_ps(lo, tail, x + i), p0);
        }
    }
    _mm512_storeu_ps(m1, p0); _mm512_storeu_ps(m1 + 16, p1);
    _mm512_storeu_ps(m1 + 32, p2); _mm512_storeu_ps(m1 + 48, p3);
    _mm512_storeu_ps(m2, q0); _mm512_storeu_ps(m2 + 16, q1);
    _mm512_storeu_ps(m2 + 32, q2); _mm512_storeu_ps(m2 + 48, q3);
    return fs_merge2(m1, second ? m2 : NULL, 64, second);
}

__attribute__((target("avx512f")))
static int fs_find_avx512(const float *x, int n, float v) {
    const __m512 vv = _mm512_set1_ps(v);
    __mmask16 tail;
    unsigned mask;
    int i = 0;
    for (; i < n; i += 16) {
        tail = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        mask = (unsigned)_mm512_mask_cmp_ps_mask(tail, _mm512_maskz_loadu_ps(tail, x + i), vv, _CMP_EQ_OQ);
        if (mask)
            return i + __builtin_ctz(mask);
    }
    return 0;
}

#endif /* FS_X86 */

/* ---- 64-bit Arm: NEON --------------------------------------------------------------- */
#if FS_NEON

static FS_INLINE float32x4_t fs_exp4(float32x4_t v, float32x4_t lo) {
    uint32x4_t keep = vcgtq_f32(v, lo);                       /* NaN: false */
    float32x4_t k, r, p, s;
    v = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), keep));
    k = vrndnq_f32(vmulq_n_f32(v, FS_LOG2E));
    r = vfmsq_f32(v, k, vdupq_n_f32(FS_LN2_HI));
    r = vfmsq_f32(r, k, vdupq_n_f32(FS_LN2_LO));
    p = vdupq_n_f32(FS_C7);
    p = vfmaq_f32(vdupq_n_f32(FS_C6), p, r);
    p = vfmaq_f32(vdupq_n_f32(FS_C5), p, r);
    p = vfmaq_f32(vdupq_n_f32(FS_C4), p, r);
    p = vfmaq_f32(vdupq_n_f32(FS_C3), p, r);
    p = vfmaq_f32(vdupq_n_f32(FS_C2), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    s = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(vmulq_f32(p, s)), keep));
}

static FS_INLINE float64x2_t fs_add4_pd(float64x2_t acc, float32x4_t e) {
    acc = vaddq_f64(acc, vcvt_f64_f32(vget_low_f32(e)));
    return vaddq_f64(acc, vcvt_high_f64_f32(e));
}

static double fs_exp_sum_neon(const float *x, int n, float inv_t, float m, float lo, float *out) {
    const float32x4_t vm = vdupq_n_f32(m), vlo = vdupq_n_f32(lo);
    float64x2_t s0 = vdupq_n_f64(0.0), s1 = vdupq_n_f64(0.0);
    double s;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t e0 = fs_exp4(vsubq_f32(vmulq_n_f32(vld1q_f32(x + i), inv_t), vm), vlo);
        float32x4_t e1 = fs_exp4(vsubq_f32(vmulq_n_f32(vld1q_f32(x + i + 4), inv_t), vm), vlo);
        if (out) {
            vst1q_f32(out + i, e0);
            vst1q_f32(out + i + 4, e1);
        }
        s0 = fs_add4_pd(s0, e0);
        s1 = fs_add4_pd(s1, e1);
    }
    for (; i + 4 <= n; i += 4) {
        float32x4_t e0 = fs_exp4(vsubq_f32(vmulq_n_f32(vld1q_f32(x + i), inv_t), vm), vlo);
        if (out)
            vst1q_f32(out + i, e0);
        s0 = fs_add4_pd(s0, e0);
    }
    if (i < n) {            /* the last few through the same arithmetic, from a padded copy */
        float xb[4] = {0}, eb[4];
        memcpy(xb, x + i, (size_t)(n - i) * sizeof(float));
        vst1q_f32(eb, fs_exp4(vsubq_f32(vmulq_n_f32(vld1q_f32(xb), inv_t), vm), vlo));
        memset(eb + (n - i), 0, (size_t)(4 - (n - i)) * sizeof(float));
        if (out)
            memcpy(out + i, eb, (size_t)(n - i) * sizeof(float));
        s0 = fs_add4_pd(s0, vld1q_f32(eb));
    }
    s = vaddvq_f64(vaddq_f64(s0, s1));
    return s;
}

static double fs_cut_sum_neon(float *v, int n, float cut) {
    const float32x4_t c = vdupq_n_f32(cut);
    float64x2_t s0 = vdupq_n_f64(0.0);
    double s;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t a = vld1q_f32(v + i);
        a = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(a), vcgeq_f32(a, c)));
        vst1q_f32(v + i, a);
        s0 = fs_add4_pd(s0, a);
    }
    s = vaddvq_f64(s0);
    for (; i < n; i++) {
        if (v[i] < cut)
            v[i] = 0.0f;
        s += v[i];
    }
    return s;
}

static double fs_sum_above_neon(const float *v, int n, float thr) {
    const float32x4_t c = vdupq_n_f32(thr);
    float64x2_t s0 = vdupq_n_f64(0.0);
    double s;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t a = vld1q_f32(v + i);
        s0 = fs_add4_pd(s0, vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(a), vcgeq_f32(a, c))));
    }
    s = vaddvq_f64(s0);
    for (; i < n; i++)
        if (v[i] >= thr)
            s += v[i];
    return s;
}

static void fs_scale_neon(float *v, int n, float k) {
    int i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(v + i, vmulq_n_f32(vld1q_f32(v + i), k));
    for (; i < n; i++)
        v[i] *= k;
}

static int fs_gather_neon(const float *v, int n, float thr, float *vals, fs_pair *pairs) {
    const float32x4_t c4 = vdupq_n_f32(thr);
    int i = 0, c = 0, j;
    for (; i + 4 <= n; i += 4) {
        if (vmaxvq_u32(vcgeq_f32(vld1q_f32(v + i), c4)) == 0)
            continue;
        for (j = 0; j < 4; j++)
            if (v[i + j] >= thr)
                c = fs_put(v, i + j, vals, pairs, c);
    }
    for (; i < n; i++)
        if (v[i] >= thr)
            c = fs_put(v, i, vals, pairs, c);
    return c;
}

#define FS_KEEP2_NEON(v, p, q) do { \
        uint32x4_t g_ = vcgtq_f32(v, p); \
        float32x4_t t_ = vbslq_f32(g_, p, v);     /* vmaxq would pass a NaN on: selects */ \
        q = vbslq_f32(vcgtq_f32(t_, q), t_, q); \
        p = vbslq_f32(g_, v, p); \
    } while (0)

static float fs_top2_neon(const float *x, int n, float *second) {
    const float32x4_t lo = vdupq_n_f32(FS_LOWEST);
    float32x4_t p0 = lo, p1 = lo, p2 = lo, p3 = lo, q0 = lo, q1 = lo, q2 = lo, q3 = lo, v;
    float m1[16], m2[16], top, sec;
    int i = 0;
    if (second) {
        for (; i + 16 <= n; i += 16) {
            v = vld1q_f32(x + i);
            FS_KEEP2_NEON(v, p0, q0);
            v = vld1q_f32(x + i + 4);
            FS_KEEP2_NEON(v, p1, q1);
            v = vld1q_f32(x + i + 8);
            FS_KEEP2_NEON(v, p2, q2);
            v = vld1q_f32(x + i + 12);
            FS_KEEP2_NEON(v, p3, q3);
        }
    } else {
        for (; i + 16 <= n; i += 16) {
            v = vld1q_f32(x + i);
            p0 = vbslq_f32(vcgtq_f32(v, p0), v, p0);
            v = vld1q_f32(x + i + 4);
            p1 = vbslq_f32(vcgtq_f32(v, p1), v, p1);
            v = vld1q_f32(x + i + 8);
            p2 = vbslq_f32(vcgtq_f32(v, p2), v, p2);
            v = vld1q_f32(x + i + 12);
            p3 = vbslq_f32(vcgtq_f32(v, p3), v, p3);
        }
    }
    vst1q_f32(m1, p0); vst1q_f32(m1 + 4, p1); vst1q_f32(m1 + 8, p2); vst1q_f32(m1 + 12, p3);
    vst1q_f32(m2, q0); vst1q_f32(m2 + 4, q1); vst1q_f32(m2 + 8, q2); vst1q_f32(m2 + 12, q3);
    top = fs_merge2(m1, second ? m2 : NULL, 16, &sec);
    for (; i < n; i++)
        fs_keep2(x[i], &top, &sec);
    if (second)
        *second = sec;
    return top;
}

static int fs_find_neon(const float *x, int n, float v) {
    const float32x4_t vv = vdupq_n_f32(v);
    int i = 0, j;
    for (; i + 4 <= n; i += 4)
        if (vmaxvq_u32(vceqq_f32(vld1q_f32(x + i), vv)))
            for (j = 0; j < 4; j++)
                if (x[i + j] == v)
                    return i + j;
    for (; i < n; i++)
        if (x[i] == v)
            return i;
    return 0;
}

#endif /* FS_NEON */

/* ---- dispatch ----------------------------------------------------------------------- */

static int fs_path_cached = -1;

static int fs_path_best(void) {
#if FS_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return FS_PATH_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return FS_PATH_AVX2;
    return FS_PATH_SCALAR;
#elif FS_NEON
    return FS_PATH_NEON;
#else
    return FS_PATH_SCALAR;
#endif
}

static FS_INLINE int fs_vec_path(void) {
    if (fs_path_cached < 0)
        fs_path_cached = fs_path_best();      /* (a race writes the same value) */
    return fs_path_cached;
}

/* The machine can run path p: the scalar loops, its own best, or AVX2 under AVX-512. */
static int fs_can_run(int p) {
    int best = fs_path_best();
    return p == FS_PATH_SCALAR || p == best || (p == FS_PATH_AVX2 && best == FS_PATH_AVX512);
}

static int fs_set_vec_path(int p) {
    if (!fs_can_run(p))
        return 0;
    fs_path_cached = p;
    return 1;
}

static double fs_exp_sum(const float *x, int n, float inv_t, float m, float lo, float *out) {
    switch (fs_vec_path()) {
#if FS_X86
    case FS_PATH_AVX512: return fs_exp_sum_avx512(x, n, inv_t, m, lo, out);
    case FS_PATH_AVX2: return fs_exp_sum_avx2(x, n, inv_t, m, lo, out);
#elif FS_NEON
    case FS_PATH_NEON: return fs_exp_sum_neon(x, n, inv_t, m, lo, out);
#endif
    default: return fs_exp_sum_scalar(x, n, inv_t, m, lo, out);
    }
}

static double fs_cut_sum(float *v, int n, float cut) {
    switch (fs_vec_path()) {
#if FS_X86
    case FS_PATH_AVX512: return fs_cut_sum_avx512(v, n, cut);
    case FS_PATH_AVX2: return fs_cut_sum_avx2(v, n, cut);
#elif FS_NEON
    case FS_PATH_NEON: return fs_cut_sum_neon(v, n, cut);
#endif
    default: return fs_cut_sum_scalar(v, n, cut);
    }
}

static double fs_sum_above(const float *v, int n, float thr) {
    switch (fs_vec_path()) {
#if FS_X86
    case FS_PATH_AVX512: return fs_sum_above_avx512(v, n, thr);
    case FS_PATH_AVX2: return fs_sum_above_avx2(v, n, thr);
#elif FS_NEON
    case FS_PATH_NEON: return fs_sum_above_neon(v, n, thr);
#endif
    default: return fs_sum_above_scalar(v, n, thr);
    }
}

static void fs_scale(float *v, int n, float k) {
    switch (fs_vec_path()) {
#if FS_X86
    case FS_PATH_AVX512: fs_scale_avx512(v, n, k); return;
    case FS_PATH_AVX2: fs_scale_avx2(v, n, k); return;
#elif FS_NEON
    case FS_PATH_NEON: fs_scale_neon(v, n, k); return;
#endif
    default: fs_scale_scalar(v, n, k);
    }
}

static int fs_gather(const float *v, int n, float thr, float *vals, fs_pair *pairs) {
    switch (fs_vec_path()) {
#if FS_X86
    case FS_PATH_AVX512: return fs_gather_avx512(v, n, thr, vals, pairs);
    case FS_PATH_AVX2: return fs_gather_avx2(v, n, thr, vals, pairs);
#elif FS_NEON
    case FS_PATH_NEON: return fs_gather_neon(v, n, thr, vals, pairs);
#endif
    default: return fs_gather_scalar(v, n, thr, vals, pairs);
    }
}

static float fs_top2(const float *x, int n, float *second) {
    switch (fs_vec_path()) {
#if FS_X86
    case FS_PATH_AVX512: return fs_top2_avx512(x, n, second);
    case FS_PATH_AVX2: return fs_top2_avx2(x, n, second);
#elif FS_NEON
    case FS_PATH_NEON: return fs_top2_neon(x, n, second);
#endif
    default: return fs_top2_scalar(x, n, second);
    }
}

static int fs_find(const float *x, int n, float v) {
    switch (fs_vec_path()) {
#if FS_X86
    case FS_PATH_AVX512: return fs_find_avx512(x, n, v);
    case FS_PATH_AVX2: return fs_find_avx2(x, n, v);
#elif FS_NEON
    case FS_PATH_NEON: return fs_find_neon(x, n, v);
#endif
    default: return fs_find_scalar(x, n, v);
    }
}

#endif /* FASTSPEC_VECMATH_H */
