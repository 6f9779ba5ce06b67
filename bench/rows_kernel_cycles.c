// Cycles a rows kernel takes per row and per 2048 multiply-adds, one thread, on random weights:
// repacked Q4_K 8x8 (ggml_gemv_q4_K_8x8_q8_K_rows), Q6_K (ggml_vec_dot_q6_K_q8_K_rows) or repacked Q6_K 8x8
// (ggml_gemv_q6_K_8x8_q8_K_rows: x86 with AVX-512 VNNI, patch 0051), n = 1536
// wide (the default target's rows), nc weight rows, batches of 1..16 rows, best of several calls.
// Kernel changes show here without a whole pass's noise (memory, other layers, the machine's pace);
// the switches the kernels read (GGML_CPU_Q4_K_FUSED256, GGML_CPU_Q6_K_C64, GGML_CPU_ZMM_PAIRS) apply.
//
// Build against a build tree's static libraries (after `pip install -e .` or a cmake build):
//   B=build/cp311-cp311-linux_x86_64/llama.cpp/ggml/src
//   g++ -O2 -x c bench/rows_kernel_cycles.c -x none $B/libggml-cpu.a $B/libggml-base.a -fopenmp -lm -o /tmp/rkc
//   /tmp/rkc q4 8960 3.66      # kind, weight rows, the core's clock in GHz (cycles = seconds x clock)
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void ggml_gemv_q4_K_8x8_q8_K_rows(int n, float * s, size_t bs, const void * vx, const void * vy, size_t by, int nrows, int nc);
void ggml_vec_dot_q6_K_q8_K_rows(int n, float * s, size_t bs, const void * vx, const void * vy, size_t by, int nrows);
void ggml_gemv_q6_K_8x8_q8_K_rows(int n, float * s, size_t bs, const void * vx, const void * vy, size_t by, int nrows, int nc);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char ** argv) {
    if (argc < 4 || (strcmp(argv[1], "q4") != 0 && strcmp(argv[1], "q6") != 0 && strcmp(argv[1], "q6x8") != 0)) {
        fprintf(stderr, "usage: %s q4|q6|q6x8 WEIGHT_ROWS CLOCK_GHZ\n", argv[0]);
        return 2;
    }
    const int q4 = strcmp(argv[1], "q4") == 0, q6x8 = strcmp(argv[1], "q6x8") == 0, n = 1536, nb = n / 256, nc = atoi(argv[2]) / 8 * 8;
    const double ghz = atof(argv[3]);
    const size_t q4_block = 1152, q6_block = 210, q8_block = 292;   // block_q4_Kx8, block_q6_K, block_q8_K
    const size_t wsz = q4 ? (size_t) nc / 8 * nb * q4_block : (size_t) nc * nb * q6_block;
    uint8_t * w = aligned_alloc(64, (wsz + 63) / 64 * 64);
    for (size_t i = 0; i < wsz; i++) w[i] = (uint8_t) rand();
    for (size_t b = 0; b < wsz / (q4 ? q4_block : q6_block); b++) {   // fp16 scales of 2.0: no NaN, no denormal
        if (q4) {
            for (int j = 0; j < 16; j++) { w[b * q4_block + 2 * j] = 0; w[b * q4_block + 2 * j + 1] = 0x40; }
        } else {
            w[b * q6_block + 208] = 0; w[b * q6_block + 209] = 0x40;
        }
    }
    for (size_t b = 0; q6x8 && b < wsz / (8 * q6_block); b++) {   // block_q6_Kx8: its 8 d first
        for (int j = 0; j < 8; j++) { w[b * 8 * q6_block + 2 * j] = 0; w[b * 8 * q6_block + 2 * j + 1] = 0x40; }
    }
    const size_t by = (size_t) nb * q8_block;
    uint8_t * y = aligned_alloc(64, (16 * by + 63) / 64 * 64);
    for (size_t i = 0; i < 16 * by; i++) y[i] = (uint8_t) (rand() % 64);
    for (int r = 0; r < 16; r++) {
        for (int b = 0; b < nb; b++) { const float d = 0.01f; memcpy(y + r * by + b * q8_block, &d, 4); }
    }
    float * s = malloc(sizeof(float) * 16 * nc);
    const int rows[] = {1, 2, 3, 4, 8, 9, 12, 16};
    for (int ri = 0; ri < (int) (sizeof(rows) / sizeof(rows[0])); ri++) {
        const int R = rows[ri];
        double best = 1e9;
        for (int rep = 0; rep < (nc <= 2048 ? 50 : 7); rep++) {
            const double t = now();
            if (q4) {
                ggml_gemv_q4_K_8x8_q8_K_rows(n, s, nc, w, y, by, R, nc);
            } else if (q6x8) {   // the same bytes read as repacked Q6_K (its d fields set above)
                ggml_gemv_q6_K_8x8_q8_K_rows(n, s, nc, w, y, by, R, nc);
            } else {
                for (int c = 0; c < nc; c++) {
                    ggml_vec_dot_q6_K_q8_K_rows(n, s + c, nc, w + (size_t) c * nb * q6_block, y, by, R);
                }
            }
            const double dt = now() - t;
            best = dt < best ? dt : best;
        }
        const double units = (double) R * nc * nb / 8;   // rows x 2048 multiply-adds
        printf("%s rows %2d: %7.3f ms, %6.1f cycles per row and 2048 multiply-adds\n",
               argv[1], R, best * 1e3, best * ghz * 1e9 / units);
    }
    free(s); free(y); free(w);
    return 0;
}
