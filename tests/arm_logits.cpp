// Batched against one-token logits through libllama, for tests/test_arm_emulated.py (which
// cross-builds this for aarch64 and runs it under qemu).  Usage:
//   arm_logits MODEL N_PREFIX [REPACK 0/1] [FLASH_ATTN 0/1] [ONE_TOKEN_LOGITS_OUT]
// Decodes N_PREFIX random tokens, then 40 more one at a time (their logits are the
// reference, optionally written out as float32), then the same 40 in chunks of 2..16 with
// logits at every position; prints per chunk size how many positions are bit-identical to
// the reference, and IDENTICAL or DIFFERENT last (exit status 0 or 3).
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <random>
#include <cmath>

static bool decode(llama_context * ctx, const std::vector<llama_token> & toks, int pos0, bool all_logits) {
    llama_batch b = llama_batch_init((int) toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); ++i) {
        b.token[i] = toks[i]; b.pos[i] = pos0 + (int) i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0;
        b.logits[i] = all_logits || i + 1 == toks.size();
    }
    b.n_tokens = (int) toks.size();
    const int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    return rc == 0;
}

int main(int argc, char ** argv) {
    if (argc < 3) { fprintf(stderr, "usage: arm_logits MODEL N_PREFIX [REPACK 0/1] [FLASH_ATTN 0/1] [OUT]\n"); return 2; }
    const int n_prefix = atoi(argv[2]);
    const bool repack = argc > 3 ? atoi(argv[3]) != 0 : true;
    const bool fa = argc > 4 ? atoi(argv[4]) != 0 : true;
    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    auto mp = llama_model_default_params();
    mp.use_extra_bufts = repack;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    auto cp = llama_context_default_params();
    cp.n_ctx = 1024; cp.n_batch = 1024; cp.n_ubatch = 1024; cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx = llama_init_from_model(model, cp);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::mt19937 rng(7);
    std::vector<llama_token> prefix(n_prefix), toks(40);
    for (auto & t : prefix) t = rng() % n_vocab;
    for (auto & t : toks) t = rng() % n_vocab;
    llama_memory_t mem = llama_get_memory(ctx);
    // one token at a time
    llama_memory_clear(mem, true);
    if (n_prefix && !decode(ctx, prefix, 0, false)) return 1;
    std::vector<std::vector<float>> ref;
    for (size_t i = 0; i < toks.size(); ++i) {
        if (!decode(ctx, {toks[i]}, n_prefix + (int) i, true)) return 1;
        const float * l = llama_get_logits_ith(ctx, -1);
        ref.emplace_back(l, l + n_vocab);
    }
    if (argc > 5) {   // the one-token logits, for comparing builds or switches
        FILE * f = fopen(argv[5], "wb");
        for (auto & r : ref) fwrite(r.data(), sizeof(float), r.size(), f);
        fclose(f);
    }
    int bad_total = 0;
    for (int k : {2, 3, 4, 5, 7, 8, 9, 12, 16}) {
        llama_memory_clear(mem, true);
        if (n_prefix && !decode(ctx, prefix, 0, false)) return 1;
        int same = 0, n = 0; float worst = 0;
        for (size_t s = 0; s < toks.size(); s += k) {
            std::vector<llama_token> chunk(toks.begin() + s, toks.begin() + std::min(toks.size(), s + k));
            if (!decode(ctx, chunk, n_prefix + (int) s, true)) return 1;
            for (size_t j = 0; j < chunk.size(); ++j) {
                const float * l = llama_get_logits_ith(ctx, (int) j);
                const bool eq = memcmp(l, ref[s + j].data(), n_vocab * sizeof(float)) == 0;
                same += eq; ++n;
                for (int v = 0; v < n_vocab; ++v) { float d = fabsf(l[v] - ref[s + j][v]); if (d > worst) worst = d; }
            }
        }
        printf("chunks of %2d: %d/%d positions bit-identical, max diff %g\n", k, same, n, worst);
        bad_total += n - same;
    }
    llama_free(ctx); llama_model_free(model);
    printf(bad_total ? "DIFFERENT\n" : "IDENTICAL\n");
    return bad_total ? 3 : 0;
}
