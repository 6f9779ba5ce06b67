// One rows kernel from two builds side by side: each build's static CPU library linked into a shared
// object of its own, both loaded in one process, their calls alternated on the same weights and q8 rows,
// the best time of each kept.  The machine's pace (another VM's memory traffic, the clock) moves both
// alike, where two processes timed one after the other would see it as a difference; the outputs are
// compared bit for bit.  Kinds: repacked Q4_K 8x8 (ggml_gemv_q4_K_8x8_q8_K_rows) and repacked Q6_K 8x8
// (ggml_gemv_q6_K_8x8_q8_K_rows, x86 with AVX-512 VNNI: patch 0051).  A matrix larger than the caches
// (65536 x 1536 Q6_K is 82 MB) is read from memory as a pass reads its weights.
//
//   B=build/cp311-cp311-linux_x86_64/llama.cpp/ggml/src
//   g++ -shared -o /tmp/a.so -Wl,--whole-archive OLD/libggml-cpu.a $B/libggml-base.a -Wl,--no-whole-archive -fopenmp
//   g++ -shared -o /tmp/b.so -Wl,--whole-archive $B/libggml-cpu.a $B/libggml-base.a -Wl,--no-whole-archive -fopenmp
//   gcc -O2 bench/rows_kernel_ab.c -ldl -o /tmp/rkab
//   /tmp/rkab /tmp/a.so /tmp/b.so q4 8960 1536 1,2,4,8,16 40 3.66
//        # A.so B.so kind weight-rows row-width batch-sizes calls-each clock-GHz
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*rows_fn)(int, float *, size_t, const void *, const void *, size_t, int, int);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char ** argv) {
    if (argc < 9 || (strcmp(argv[3], "q4") != 0 && strcmp(argv[3], "q6x8") != 0)) {
        fprintf(stderr, "usage: %s A.so B.so q4|q6x8 WEIGHT_ROWS ROW_WIDTH SIZES CALLS CLOCK_GHZ\n", argv[0]);
        return 2;
    }
    const int q4 = strcmp(argv[3], "q4") == 0;
    const char * sym = q4 ? "ggml_gemv_q4_K_8x8_q8_K_rows" : "ggml_gemv_q6_K_8x8_q8_K_rows";
    rows_fn f[2];
    for (int m = 0; m < 2; m++) {
        void * h = dlopen(argv[1 + m], RTLD_NOW | RTLD_LOCAL);
        if (!h || !(f[m] = (rows_fn) dlsym(h, sym))) {
            fprintf(stderr, "%s: %s\n", argv[1 + m], h ? "no rows kernel of that kind" : dlerror());
            return 1;
        }
    }
    const int nc = atoi(argv[4]) / 8 * 8, n = atoi(argv[5]) / 256 * 256, nb = n / 256, calls = atoi(argv[7]);
    const double ghz = atof(argv[8]);
    if (nc < 8 || nb < 1 || calls < 1 || ghz <= 0) {
        fprintf(stderr, "weight rows >= 8, row width >= 256, calls >= 1, clock > 0\n");
        return 2;
    }
    // block_q4_Kx8: d[8], dmin[8] (fp16) first; block_q6_Kx8: d[8] first; block_q8_K: 292 bytes
    const size_t blk = q4 ? 1152 : 1680, n_halves = q4 ? 16 : 8, q8 = 292, wsz = (size_t) nc / 8 * nb * blk;
    uint8_t * w = aligned_alloc(64, (wsz + 63) / 64 * 64);
    for (size_t i = 0; i < wsz; i++) w[i] = (uint8_t) rand();
    for (size_t b = 0; b < wsz / blk; b++) {          // fp16 scales near 0.5-2: no NaN, no infinity
        for (size_t j = 0; j < n_halves; j++) {
            w[b * blk + 2 * j] = (uint8_t) rand();
            w[b * blk + 2 * j + 1] = (uint8_t) (0x38 + (rand() & 3));
        }
    }
    const size_t by = (size_t) nb * q8;
    uint8_t * y = aligned_alloc(64, (16 * by + 63) / 64 * 64);
    for (size_t i = 0; i < 16 * by; i++) y[i] = (uint8_t) rand();
    for (int r = 0; r < 16; r++) {                    // d, 256 int8, then the sums of each 16 (as ggml makes them)
        for (int b = 0; b < nb; b++) {
            uint8_t * q = y + r * by + b * q8;
            const float d = 0.01f;
            memcpy(q, &d, 4);
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++) s += (int8_t) q[4 + 16 * g + j];
                const int16_t v = (int16_t) s;
                memcpy(q + 4 + 256 + 2 * g, &v, 2);
            }
        }
    }
    float * s[2] = {malloc(sizeof(float) * 16 * nc), malloc(sizeof(float) * 16 * nc)};
    int same = 1;
    for (char * t = strtok(argv[6], ","); t; t = strtok(NULL, ",")) {
        const int R = atoi(t);
        if (R < 1 || R > 16) {
            fprintf(stderr, "batch sizes 1..16\n");
            return 2;
        }
        double best[2] = {1e9, 1e9};
        for (int c = 0; c < calls; c++) {
            for (int m = 0; m < 2; m++) {
                const double t0 = now();
                f[m](n, s[m], nc, w, y, by, R, nc);
                const double dt = now() - t0;
                best[m] = dt < best[m] ? dt : best[m];
            }
        }
        same &= memcmp(s[0], s[1], sizeof(float) * R * nc) == 0;
        const double units = (double) R * nc * nb / 8;   // rows x 2048 multiply-adds
        printf("rows %2d: A %6.1f  B %6.1f cycles per row and 2048 multiply-adds, B/A %.3f\n",
               R, best[0] * ghz * 1e9 / units, best[1] * ghz * 1e9 / units, best[1] / best[0]);
    }
    printf("outputs %s\n", same ? "bit-identical" : "DIFFER");
    free(s[0]); free(s[1]); free(y); free(w);
    return same ? 0 : 1;
}
