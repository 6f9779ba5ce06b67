/* Runs src/fastspec/_vecmath.h's loops on one row (tests/test_vecmath_arm.py builds it for
 * 64-bit Arm and runs it under qemu-aarch64, so that the NEON loops are checked on x86).
 *
 *   vecmath_check IN N TEMPERATURE CUT OUT
 *
 * IN: N float32 logits.  Writes to OUT the weights exp(x / T - max) (N float32), then the
 * weights with those below CUT zeroed, then the latter scaled by 1 / their sum; prints the
 * path, the weights' sum, the sum of those >= CUT, the kept sum, and how many fs_gather
 * finds at or above CUT (values and pairs) with the first pair's index, then the greedy pick
 * over the logits: the largest, the runner-up, the largest alone, and its first index. */
#include <stdio.h>
#include <stdlib.h>
#include "_vecmath.h"

int main(int argc, char **argv) {
    int n, i, c1, c2;
    float t, cut, m, top, second, top_only, *x, *w;
    double total, above, kept;
    float *vals;
    fs_pair *pairs;
    FILE *f;
    if (argc != 6)
        return 2;
    n = atoi(argv[2]);
    t = (float)atof(argv[3]);
    cut = (float)atof(argv[4]);
    x = malloc(n * sizeof(float));
    w = malloc(n * sizeof(float));
    vals = malloc(n * sizeof(float));
    pairs = malloc(n * sizeof(fs_pair));
    f = fopen(argv[1], "rb");
    if (!f || fread(x, sizeof(float), n, f) != (size_t)n)
        return 3;
    fclose(f);
    m = x[0];
    for (i = 1; i < n; i++)
        m = x[i] > m ? x[i] : m;
    f = fopen(argv[5], "wb");
    total = fs_exp_sum(x, n, 1.0f / t, m * (1.0f / t), -30.0f, w);
    fwrite(w, sizeof(float), n, f);
    above = fs_sum_above(w, n, cut);
    c1 = fs_gather(w, n, cut, vals, NULL);
    c2 = fs_gather(w, n, cut, NULL, pairs);
    kept = fs_cut_sum(w, n, cut);
    fwrite(w, sizeof(float), n, f);
    fs_scale(w, n, (float)(1.0 / kept));
    fwrite(w, sizeof(float), n, f);
    fclose(f);
    printf("%d %.17g %.17g %.17g %d %d %d", fs_vec_path(), total, above, kept, c1, c2, c2 > 0 ? pairs[0].id : -1);
    top = fs_top2(x, n, &second);
    top_only = fs_top2(x, n, NULL);
    printf(" %.9g %.9g %.9g %d\n", top, second, top_only, fs_find(x, n, top));
    return 0;
}
