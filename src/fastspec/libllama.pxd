# The part of libllama's C API (vendor/llama.cpp/include/llama.h) that fastspec uses.
# Declarations only; structs list only the fields fastspec reads or writes.
from libc.stdint cimport int8_t, int32_t, int64_t, uint32_t, uint64_t

cdef extern from "llama.h" nogil:
    # -- from ggml.h (included by llama.h) --
    enum ggml_log_level:
        GGML_LOG_LEVEL_NONE
        GGML_LOG_LEVEL_DEBUG
        GGML_LOG_LEVEL_INFO
        GGML_LOG_LEVEL_WARN
        GGML_LOG_LEVEL_ERROR
        GGML_LOG_LEVEL_CONT
    ctypedef void (*ggml_log_callback)(ggml_log_level level, const char * text, void * user_data) noexcept
    ctypedef bint (*ggml_abort_callback)(void * data) noexcept

    # -- opaque handles and scalar types --
    cdef struct llama_vocab
    cdef struct llama_model
    cdef struct llama_context
    cdef struct llama_memory_i
    ctypedef llama_memory_i * llama_memory_t
    ctypedef int32_t llama_pos
    ctypedef int32_t llama_token
    ctypedef int32_t llama_seq_id

    enum llama_vocab_type:
        LLAMA_VOCAB_TYPE_NONE
        LLAMA_VOCAB_TYPE_SPM
        LLAMA_VOCAB_TYPE_BPE
        LLAMA_VOCAB_TYPE_WPM
        LLAMA_VOCAB_TYPE_UGM
        LLAMA_VOCAB_TYPE_RWKV
        LLAMA_VOCAB_TYPE_PLAMO2

    enum llama_token_attr:
        LLAMA_TOKEN_ATTR_CONTROL

    enum llama_ftype:
        LLAMA_FTYPE_ALL_F32
        LLAMA_FTYPE_MOSTLY_F16

    enum llama_flash_attn_type:
        LLAMA_FLASH_ATTN_TYPE_AUTO
        LLAMA_FLASH_ATTN_TYPE_DISABLED
        LLAMA_FLASH_ATTN_TYPE_ENABLED

    ctypedef bint (*llama_progress_callback)(float progress, void * user_data) noexcept

    ctypedef struct llama_batch:
        int32_t n_tokens
        llama_token * token
        float * embd
        llama_pos * pos
        int32_t * n_seq_id
        llama_seq_id ** seq_id
        int8_t * logits

    enum llama_load_mode:
        LLAMA_LOAD_MODE_AUTO
        LLAMA_LOAD_MODE_NONE
        LLAMA_LOAD_MODE_MMAP

    struct llama_model_params:
        int32_t n_gpu_layers
        llama_load_mode load_mode
        int32_t main_gpu
        llama_progress_callback progress_callback
        void * progress_callback_user_data
        bint vocab_only
        bint check_tensors
        bint use_extra_bufts

    struct llama_context_params:
        uint32_t n_ctx
        uint32_t n_batch
        uint32_t n_ubatch
        uint32_t n_seq_max
        int32_t n_threads
        int32_t n_threads_batch
        llama_flash_attn_type flash_attn_type
        ggml_abort_callback abort_callback
        void * abort_callback_data
        bint embeddings
        bint offload_kqv
        bint no_perf

    ctypedef struct llama_model_quantize_params:
        int32_t nthread
        llama_ftype ftype
        bint allow_requantize
        bint quantize_output_tensor
        bint only_copy
        bint pure

    ctypedef struct llama_chat_message:
        const char * role
        const char * content

    # -- setup --
    llama_model_params llama_model_default_params()
    llama_context_params llama_context_default_params()
    llama_model_quantize_params llama_model_quantize_default_params()
    void llama_backend_init()
    void llama_log_set(ggml_log_callback log_callback, void * user_data)
    const char * llama_print_system_info()
    bint llama_supports_gpu_offload()

    # -- model --
    llama_model * llama_model_load_from_file(const char * path_model, llama_model_params params)
    void llama_model_free(llama_model * model)
    const llama_vocab * llama_model_get_vocab(const llama_model * model)
    int32_t llama_model_n_ctx_train(const llama_model * model)
    int32_t llama_model_n_embd(const llama_model * model)
    int32_t llama_model_n_layer(const llama_model * model)
    int32_t llama_model_meta_count(const llama_model * model)
    int32_t llama_model_meta_key_by_index(const llama_model * model, int32_t i, char * buf, size_t buf_size)
    int32_t llama_model_meta_val_str_by_index(const llama_model * model, int32_t i, char * buf, size_t buf_size)
    int32_t llama_model_meta_val_str(const llama_model * model, const char * key, char * buf, size_t buf_size)
    int32_t llama_model_desc(const llama_model * model, char * buf, size_t buf_size)
    uint64_t llama_model_size(const llama_model * model)
    uint64_t llama_model_n_params(const llama_model * model)
    const char * llama_model_chat_template(const llama_model * model, const char * name)
    bint llama_model_is_recurrent(const llama_model * model)
    int32_t llama_model_n_swa(const llama_model * model)
    bint llama_model_is_hybrid(const llama_model * model)
    uint32_t llama_model_quantize(const char * fname_inp, const char * fname_out,
                                  const llama_model_quantize_params * params)

    # -- vocab --
    llama_vocab_type llama_vocab_get_type "llama_vocab_type"(const llama_vocab * vocab)
    int32_t llama_vocab_n_tokens(const llama_vocab * vocab)
    const char * llama_vocab_get_text(const llama_vocab * vocab, llama_token token)
    llama_token_attr llama_vocab_get_attr(const llama_vocab * vocab, llama_token token)
    bint llama_vocab_is_eog(const llama_vocab * vocab, llama_token token)
    bint llama_vocab_is_control(const llama_vocab * vocab, llama_token token)
    llama_token llama_vocab_bos(const llama_vocab * vocab)
    llama_token llama_vocab_eos(const llama_vocab * vocab)
    llama_token llama_vocab_eot(const llama_vocab * vocab)
    bint llama_vocab_get_add_bos(const llama_vocab * vocab)
    bint llama_vocab_get_add_eos(const llama_vocab * vocab)
    int32_t llama_tokenize(const llama_vocab * vocab, const char * text, int32_t text_len,
                           llama_token * tokens, int32_t n_tokens_max,
                           bint add_special, bint parse_special)
    int32_t llama_token_to_piece(const llama_vocab * vocab, llama_token token, char * buf,
                                 int32_t length, int32_t lstrip, bint special)
    int32_t llama_detokenize(const llama_vocab * vocab, const llama_token * tokens, int32_t n_tokens,
                             char * text, int32_t text_len_max, bint remove_special, bint unparse_special)
    int32_t llama_chat_apply_template(const char * tmpl, const llama_chat_message * chat, size_t n_msg,
                                      bint add_ass, char * buf, int32_t length)

    # -- context --
    llama_context * llama_init_from_model(llama_model * model, llama_context_params params)
    void llama_free(llama_context * ctx)
    uint32_t llama_n_ctx(const llama_context * ctx)
    uint32_t llama_n_batch(const llama_context * ctx)
    llama_memory_t llama_get_memory(const llama_context * ctx)
    void llama_memory_clear(llama_memory_t mem, bint data)
    bint llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1)
    llama_pos llama_memory_seq_pos_max(llama_memory_t mem, llama_seq_id seq_id)
    void llama_set_n_threads(llama_context * ctx, int32_t n_threads, int32_t n_threads_batch)
    void llama_set_abort_callback(llama_context * ctx, ggml_abort_callback abort_callback, void * data)
    llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max)
    void llama_batch_free(llama_batch batch)
    int32_t llama_decode(llama_context * ctx, llama_batch batch)
    void llama_synchronize(llama_context * ctx)
    float * llama_get_logits_ith(llama_context * ctx, int32_t i)
    int64_t llama_time_us()


# Defined by CMakeLists.txt: the largest verification batch that the build's ggml patches
# make bit-identical to one-token decodes (0 when built without them).
cdef extern from *:
    """
    #ifndef FASTSPEC_INVARIANT_ROWS
    #define FASTSPEC_INVARIANT_ROWS 0
    #endif
    """
    int FASTSPEC_INVARIANT_ROWS

# Whether the build kept ggml's Intel AMX kernels (FASTSPEC_AMX=ON and a probe that ran;
# cmake/amx_probe.cmake): 0 on every build that was not asked to.
cdef extern from *:
    """
    #ifndef FASTSPEC_AMX_KEPT
    #define FASTSPEC_AMX_KEPT 0
    #endif
    """
    int FASTSPEC_AMX_KEPT

# The CUDA backend's counterpart (patches 0022-0024, CUDA builds only): the largest verification
# batch whose logits ggml-cuda computes bit-identically to one-token decodes
# (GGML_CUDA_INVARIANT_ROWS, read once by ggml; 16 by default), 0 on builds without CUDA or
# without the patches.
cdef extern from *:
    """
    #if defined(FASTSPEC_CUDA_PATCHED) && FASTSPEC_CUDA_PATCHED
    #ifdef __cplusplus
    extern "C"
    #endif
    int64_t ggml_cuda_invariant_rows(void);
    #define fastspec_cuda_invariant_rows() ggml_cuda_invariant_rows()
    #else
    #define fastspec_cuda_invariant_rows() ((int64_t) 0)
    #endif
    """
    int64_t fastspec_cuda_invariant_rows()

# llama_set_n_logits comes with patch 0007 (FASTSPEC_PATCHED defined by CMakeLists.txt);
# without the patches the call answers false and changes nothing.
cdef extern from *:
    """
    #if defined(FASTSPEC_PATCHED) && FASTSPEC_PATCHED
    #define fastspec_set_n_logits(ctx, n, ex, n_ex) llama_set_n_logits((ctx), (n), (ex), (n_ex))
    #else
    #define fastspec_set_n_logits(ctx, n, ex, n_ex) ((void)(ctx), (void)(n), (void)(ex), (void)(n_ex), 0)
    #endif
    """
    bint fastspec_set_n_logits(llama_context * ctx, int32_t n, const llama_token * extra,
                               int32_t n_extra) nogil

# The CPU backend's kernel choices made once from the CPU (ggml-cpu, linked in statically), 0
# without the patches: ggml_cpu_zmm_pairs (patches 0017, 0047), 1 where the AVX-512 rows kernels take
# two weight blocks per 512-bit register, 2 where they do so for one-row products alone; ggml_cpu_q4_0_rows_prompts (patch 0021), 1 where
# repacked Q4_0 times a prompt-sized batch takes the rows kernel instead of ggml's gemm.
cdef extern from *:
    """
    #if defined(FASTSPEC_PATCHED) && FASTSPEC_PATCHED
    int ggml_cpu_zmm_pairs(void);
    int ggml_cpu_q4_0_rows_prompts(void);
    #define fastspec_zmm_pairs() ggml_cpu_zmm_pairs()
    #define fastspec_q4_0_rows_prompts() ggml_cpu_q4_0_rows_prompts()
    #else
    #define fastspec_zmm_pairs() 0
    #define fastspec_q4_0_rows_prompts() 0
    #endif
    """
    int fastspec_zmm_pairs()
    int fastspec_q4_0_rows_prompts()
