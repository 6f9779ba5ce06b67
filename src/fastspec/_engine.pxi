# The generation loop.  Included into _core.pyx after the proposers and the policy.
# One call of Generator._step() is one target pass: ask every proposer for a proposal,
# let the policy pick one (or none: the target alone), verify it in one batched decode,
# emit the accepted prefix plus one token of the target's own, trim the KV caches to
# what was kept, and tell every proposer how the sequence grew.

cdef enum:
    MAX_FREE = 4            # free proposers (lookup, prediction, suffix, ...) per generation
    SHADOW_CHECK = 2        # tokens of a free proposal not verified that are checked (greedy; _shadow_free)
    GPU_WARMUPS = 2         # untimed passes of each shape before calibration times it on a GPU
    CH_TARGET = -1          # pass choices: the target alone,
    CH_DRAFT = -2           # the draft model, or 0..MAX_FREE-1: that free proposer

# In combined mode the draft model serves only the tokens the free proposers (lookup, ...) do
# not: its one-off catch-up (reading a new prompt) is spread over that share of the tokens
# expected.  The share: what they made of this generation so far, with what they made of recent
# ones (AcceptanceModel.free_share) worth FREE_SHARE_N tokens of it; a generation of
# FREE_SHARE_MIN tokens or more is recorded, apart for long prompts and short ones (what lookup
# makes follows what the prompt gives it to copy: an edit's code; the seventy-third session's
# bench, edits in combined mode after chat and code: the draft read each edit's prompt at its
# first token on a share averaged over chat and code answers, 0.3 s for one token, then lookup
# made 112 of 128: combined 3.94x against lookup's 4.43x).  (The policy what-if at a bench run's
# costs, combined mode, the bench's history replayed: the draft read each code edit's prompt at
# its first token and then ran one to three passes, edit 2.83x against lookup mode's 3.08x; now
# 3.10x, every other prompt of the default set and Spec-Bench's first turns the same.)
cdef double FREE_SHARE_N = 8.0
cdef int FREE_SHARE_MIN = 8
FREE_SHARE_MIN_TOKENS = FREE_SHARE_MIN   # (for Python: tests)

cdef enum Finish:
    RUNNING = 0
    FIN_EOG = 1
    FIN_STOP = 2
    FIN_MAX_TOKENS = 3
    FIN_CONTEXT = 4
    FIN_ERROR = 5

FINISH_REASONS = {0: None, 1: "stop", 2: "stop", 3: "length", 4: "length", 5: "error"}

# limits and defaults, shared with fastspec.config
DRAFT_LIMIT = MAX_DRAFT
NGRAM_LIMIT = NGRAM_MAX_LEVELS
NGRAM_MIN_DEFAULT = NGRAM_DEFAULT_MIN
NGRAM_MAX_DEFAULT = NGRAM_DEFAULT_MAX

cdef struct Stats:
    int64_t n_drafted
    int64_t n_accepted
    int64_t n_rejected
    int64_t n_passes
    int64_t n_generated
    int64_t n_eog                     # 1 if an end-of-generation token ended the run
    int64_t n_copied                  # generated tokens copied from the prompt a windowed draft skips
    int64_t n_read_all                # 1 if the windowed draft read all of the prompt (Generator._choose)
    int64_t read_all_at               # tokens generated when it did (-1: it did not)
    int64_t draft_first_at            # tokens generated when the draft model first ran (-1: it did not)
    int64_t drafted_by_pos[MAX_DRAFT]
    int64_t accepted_by_pos[MAX_DRAFT]
    int64_t drafted_by_src[N_SOURCES]
    int64_t accepted_by_src[N_SOURCES]
    int64_t emitted_by_src[N_SOURCES]
    int64_t passes_by_src[N_SOURCES]  # passes that verified that source's proposal (target: none)
    int64_t passes_by_size[MAX_DRAFT + 2]   # target passes by the tokens they decoded (1: none proposed)
    int64_t t_prefill_us
    int64_t t_draft_us
    int64_t t_verify_us
    int64_t t_total_us
    int64_t n_draft_decodes
    int64_t n_draft_empty             # draft passes whose draft proposed nothing (a decode, no token)
    int64_t t_calibrate_us
    int64_t n_one                     # one-token target passes and the time of their decodes: the
    int64_t t_one_us                  # machine's pace in this generation, whatever was speculated

# One target pass as the policy saw it (``trace=True``): what it chose, what it expected of
# that choice and of the target alone, what came of it; for the draft model, what its choice
# was reckoned on.  Rates are tokens per second as the policy compared them.
cdef struct PassNote:
    int at                            # tokens generated before the pass
    int source                        # what it verified (a SOURCE_NAMES index; 0: nothing proposed)
    int k                             # tokens proposed and verified after the pending one
    int accepted                      # of them kept
    int emitted                       # tokens the pass emitted
    int probe                         # 1: run to learn a proposer's acceptance, not because it paid
    int draft_read                    # draft: tokens it reads before proposing (its catch-up)
    int read_all                      # 1: a windowed draft set to read all of the prompt here
    double e_pred                     # tokens the policy expected the pass to emit
    double t_pred                     # seconds it expected the pass to take
    double t                          # seconds it took (proposing, verifying, trimming)
    double rate_target                # what the target alone promised
    double rate_best                  # the best promise among the choices weighed
    double rate_draft                 # the draft model's promise (0: not weighed)
    double draft_mean                 # the draft's acceptance as reckoned (0: not weighed)
    double draft_future               # tokens the answer was expected to run on, its catch-up spread over them


cdef int index_unread(NgramIndex * ix, const ll.llama_token * seq, int n) noexcept nogil:
    """Index the COPY_NGRAM-grams of a prompt of n tokens that a windowed draft's catch-up
    skips (between its first DRAFT_HEAD and last DRAFT_WINDOW tokens).  Returns how many
    (0: the prompt is too short to skip any, or no memory: nothing to check)."""
    cdef int i, lo = DRAFT_HEAD, hi = n - DRAFT_WINDOW
    if hi - lo < 4 * COPY_NGRAM:
        return 0
    if ngram_init(ix, hi - lo, COPY_NGRAM, COPY_NGRAM) != 0:
        ngram_free(ix)
        return 0
    for i in range(lo + COPY_NGRAM, hi + 1):
        ngram_add(ix, seq, i)
    return hi + 1 - lo - COPY_NGRAM


cdef inline int copy_source(NgramIndex * ix, const ll.llama_token * seq, int p) noexcept nogil:
    """Where the prompt goes on after the COPY_NGRAM-gram that token p ends, if that
    n-gram is in the indexed (unread) part of it (token p is a copy from there); -1 if not."""
    cdef int m = 0
    return ngram_find(ix, seq, p + 1, &m)


cdef inline void copy_step(int v, int * run, int * nxt, int * gap) noexcept nogil:
    """The run of copies after a generated token whose copy source is v (-1: not a copy),
    where the prompt goes on after the last copy (``nxt``), and the tokens since it that were
    no copy (``gap``).  Any copy goes on with the run, from wherever in the unread prompt
    (code repeats its 4-grams: the latest occurrence, which the index gives, is not always
    the one being copied); more than COPY_GAP_MAX tokens in a row that are no copy end it."""
    if v >= 0:
        run[0] += 1
        nxt[0] = v
        gap[0] = 0
    else:
        gap[0] += 1
        if gap[0] > COPY_GAP_MAX:
            run[0] = 0


cdef inline int run_copy(int v, int source) noexcept nogil:
    """The copy source the run of copies counts for a token from ``source``: none for a
    token a free proposer (lookup) proposed, which serves such copies already, so that
    reading all of the prompt for the draft would add little to them."""
    return v if source == SRC_TARGET or source == SRC_DRAFT else -1


cdef list _copy_trace(prompt_tokens, generated_tokens, sources=None):
    """(copy source, run, tokens of the prompt after the last copy) per generated token, as
    the loop reckons them (copy_source, run_copy, copy_step); ``sources``: each token's
    source name (SOURCE_NAMES; None: all the target's)."""
    cdef list toks = [int(t) for t in prompt_tokens] + [int(t) for t in generated_tokens]
    cdef int n = len(prompt_tokens), total = len(toks), i, v, run = 0, nxt = -1, gap = 0
    cdef list src = [SRC_TARGET] * (total - n)
    if sources is not None:
        if len(sources) != total - n:
            raise ValueError(f"sources: one per generated token ({total - n}), got {len(sources)}")
        try:
            src = [SOURCE_NAMES.index(x) for x in sources]
        except ValueError:
            raise ValueError(f"sources: each one of {', '.join(SOURCE_NAMES)}") from None
    cdef NgramIndex ix
    memset(&ix, 0, sizeof(ix))
    cdef ll.llama_token * seq = <ll.llama_token *>malloc(max(total, 1) * sizeof(ll.llama_token))
    if seq == NULL:
        raise MemoryError()
    try:
        for i in range(total):
            seq[i] = toks[i]
        if index_unread(&ix, seq, n) == 0:
            return [(-1, 0, 0)] * (total - n)
        out = []
        for i in range(n, total):
            v = copy_source(&ix, seq, i)
            copy_step(run_copy(v, src[i - n]), &run, &nxt, &gap)
            out.append((v, run, n - nxt if run else 0))
        return out
    finally:
        ngram_free(&ix)
        free(seq)


def copy_runs(prompt_tokens, generated_tokens, sources=None):
    """For each generated token, the loop's run of copies from the part of the prompt a
    windowed draft skips (copies counted, a gap of up to COPY_GAP_MAX tokens that are no copy
    borne; a copy a free proposer such as lookup proposed counts as none), and how many
    prompt tokens follow the last copy's source (0 where the run is 0): (run, tokens left)
    pairs.  ``sources``: which proposer each generated token came from (names as in
    SOURCE_NAMES; None: the target's own)."""
    return [(run, left) for _, run, left in _copy_trace(prompt_tokens, generated_tokens, sources)]


def copied_from_unread(prompt_tokens, generated_tokens):
    """Which generated tokens the loop counts as copies from the part of the prompt a
    windowed draft model does not read (greedy, adaptive draft): their last COPY_NGRAM
    tokens occur there.  The target's certainty on those is not taken as evidence of the
    draft.  Returns a list of bools, one per generated token."""
    return [v >= 0 for v, _, _ in _copy_trace(prompt_tokens, generated_tokens)]


cdef class Generator:
    """One generation at a time on a target Context and, optionally, a draft Context and
    free proposers (n-gram lookup with ``lookup=True``; others via ``proposers=``)."""
    cdef Context tgt
    cdef Context drf
    cdef readonly int n_vocab
    cdef SamplingParams sp
    cdef bint greedy
    cdef uint64_t rng
    cdef uint64_t seed
    # settings
    cdef int n_draft_max
    cdef int n_draft_min
    cdef bint adaptive
    cdef int max_tokens
    cdef int max_verify               # largest verification batch allowed (0 = any)
    cdef bint biased_rule             # tests only: a wrong acceptance rule
    # the policy and the proposers
    cdef CostModel cost
    cdef AcceptanceModel acc
    cdef Policy policy
    cdef DraftProposer draft
    cdef Proposer fp0, fp1, fp2, fp3  # free proposers (n_free of them)
    cdef int n_free
    cdef list _free                   # the same, for Python
    cdef ll.llama_token ptok[MAX_FREE][MAX_DRAFT]
    cdef float pconf[MAX_FREE][MAX_DRAFT]
    cdef int pn[MAX_FREE]
    cdef int pkey[MAX_FREE]
    # greedy: per free proposer, one proposal not verified, checked against the tokens
    # as the passes emit them (_shadow_free): its first qn tokens, qm matched so far,
    # the first of them at position qpos
    cdef ll.llama_token qtok[MAX_FREE][SHADOW_CHECK]
    cdef float qconf[MAX_FREE][SHADOW_CHECK]
    cdef int qn[MAX_FREE]
    cdef int qm[MAX_FREE]
    cdef int qkey[MAX_FREE]
    cdef int qpos[MAX_FREE]
    cdef int n_draft_steps            # passes that ran the draft model
    # the sequence: prompt then generated tokens; the last one is "pending" (not yet in
    # the target's KV cache)
    cdef ll.llama_token * seq
    cdef int8_t * src
    cdef int8_t * tgap                # greedy, with an adaptive draft: the target's certainty
                                      # bucket for each generated token (-1 elsewhere)
    cdef bint track_tgap
    cdef NgramIndex unread            # COPY_NGRAM-grams of the prompt a windowed draft skips
    cdef bint copy_seen               # built for this generation: copies are counted (see _copy_check)
    cdef int copy_run                 # generated tokens copied from the unread prompt in the run up to now
    cdef int copy_all_run, copy_all_gap, copy_all_next   # the same run, whoever proposed the copies,
    cdef int copy_all_max             # and its longest in this generation (AcceptanceModel.copies_at_length)
    cdef int copy_gap                 # tokens since the run's last copy that were no copy
    cdef int copy_next                # where the prompt goes on after the last of them
    cdef int seq_len
    cdef int seq_cap
    cdef int n_prompt
    # this pass's proposal
    cdef ll.llama_token dtok[MAX_DRAFT]
    cdef int8_t dsrc[MAX_DRAFT]
    cdef ll.llama_token _vbatch[MAX_DRAFT + 1]
    cdef float dconf[MAX_DRAFT]
    cdef int n_emitted_last
    # generated text (bytes) for stop strings
    cdef char * text
    cdef int text_len
    cdef int text_cap
    cdef int text_end                 # text_len, or where a stop string begins
    cdef list _stops                  # keeps the bytes alive
    cdef char ** stop_ptr
    cdef int * stop_len
    cdef int n_stops
    cdef int max_stop_len
    # scratch
    cdef float * p_buf
    cdef ProbIdx * scratch
    # state
    cdef Stats st
    cdef PassNote note                # this pass's (filled by _choose and _step)
    cdef PassNote * notes             # trace=True: every pass's, in order
    cdef int n_notes
    cdef int notes_cap
    cdef bint tracing
    cdef bint notes_lost              # memory ran out: the trace stopped growing
    cdef public int finish
    cdef bint started
    cdef bint length_noted            # this generation's length went to the acceptance model

    def __cinit__(self, Context target not None, Context draft=None, *, double temperature=0.0,
                  int top_k=0, double top_p=1.0, double min_p=0.0, seed=None, int n_draft=8,
                  int n_draft_min=0, double p_min=0.0, bint adaptive=True, int max_tokens=256,
                  stop=(), bint lookup=False, int ngram_max=NGRAM_DEFAULT_MAX,
                  int ngram_min=NGRAM_DEFAULT_MIN, int max_verify=0, CostModel cost=None,
                  AcceptanceModel acceptance=None, proposers=(), bint trace=False,
                  bint _biased_rule_for_tests=False):
        self.seq = NULL
        self.notes = NULL
        self.tracing = trace
        self.src = NULL
        self.tgap = NULL
        self.text = NULL
        self.p_buf = NULL
        self.scratch = NULL
        self.stop_ptr = NULL
        self.stop_len = NULL
        target._check()
        if draft is not None:
            draft._check()
        self.tgt = target
        self.drf = draft
        self.n_vocab = target.model.n_vocab
        self.sp.temperature = temperature
        self.sp.top_k = top_k
        self.sp.top_p = top_p
        self.sp.min_p = min_p
        self.greedy = temperature == 0.0
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        self.seed = <uint64_t>(seed & 0xFFFFFFFFFFFFFFFF)
        self.rng = self.seed
        if not (1 <= n_draft <= MAX_DRAFT):
            raise ValueError(f"n_draft must be between 1 and {MAX_DRAFT}, got {n_draft}")
        if n_draft_min < 0:
            raise ValueError(f"n_draft_min must be >= 0, got {n_draft_min}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.n_draft_max = n_draft
        self.n_draft_min = n_draft_min
        self.adaptive = adaptive
        self.max_tokens = max_tokens
        self.max_verify = max_verify
        self.biased_rule = _biased_rule_for_tests
        self.cost = cost if cost is not None else CostModel()
        self.acc = acceptance if acceptance is not None else AcceptanceModel()
        self.policy = Policy(self.cost, self.acc)
        self.draft = None
        if draft is not None:
            self.draft = DraftProposer(draft, self.policy, self.n_vocab, sp=self.sp,
                                       n_draft_min=n_draft_min, p_min=p_min, adaptive=adaptive)
            self.draft.rng = &self.rng
        free_list = []
        if lookup:
            free_list.append(LookupProposer(target.n_ctx + 1, ngram_min, ngram_max))
        for p in proposers:
            if not isinstance(p, Proposer) or isinstance(p, DraftProposer):
                raise TypeError(f"proposers must be free Proposer objects, got {type(p).__name__}")
            if not (0 < (<Proposer>p).source < N_SOURCES):
                raise ValueError(f"proposer {p!r} has no valid source id")
            free_list.append(p)
        if len(free_list) > MAX_FREE:
            raise ValueError(f"at most {MAX_FREE} free proposers, got {len(free_list)}")
        self._free = free_list
        self.n_free = len(free_list)
        self.fp0 = free_list[0] if self.n_free > 0 else None
        self.fp1 = free_list[1] if self.n_free > 1 else None
        self.fp2 = free_list[2] if self.n_free > 2 else None
        self.fp3 = free_list[3] if self.n_free > 3 else None
        self._stops = [s for s in stop if len(s) > 0]
        self.n_stops = len(self._stops)
        self.stop_ptr = <char **>calloc(max(self.n_stops, 1), sizeof(char *))
        self.stop_len = <int *>calloc(max(self.n_stops, 1), sizeof(int))
        if self.stop_ptr == NULL or self.stop_len == NULL:
            raise MemoryError()
        self.max_stop_len = 0
        for i, s in enumerate(self._stops):
            self.stop_ptr[i] = <char *>(<bytes>s)
            self.stop_len[i] = len(s)
            self.max_stop_len = max(self.max_stop_len, len(s))
        self.seq_cap = target.n_ctx + 1
        self.seq = <ll.llama_token *>malloc(self.seq_cap * sizeof(ll.llama_token))
        self.src = <int8_t *>malloc(self.seq_cap * sizeof(int8_t))
        self.tgap = <int8_t *>malloc(self.seq_cap * sizeof(int8_t))
        self.text_cap = 4096
        self.text = <char *>malloc(self.text_cap)
        self.p_buf = <float *>malloc(self.n_vocab * sizeof(float))
        self.scratch = <ProbIdx *>malloc(self.n_vocab * sizeof(ProbIdx))
        if self.seq == NULL or self.src == NULL or self.tgap == NULL or self.text == NULL or self.p_buf == NULL or self.scratch == NULL:
            raise MemoryError()
        self.track_tgap = self.greedy and self.adaptive and self.draft is not None
        if self.draft is not None:
            self.draft.tgap = self.tgap
        self.started = False
        self.finish = RUNNING

    def __dealloc__(self):
        ngram_free(&self.unread)
        free(self.seq)
        free(self.src)
        free(self.tgap)
        free(self.text)
        free(self.p_buf)
        free(self.scratch)
        free(self.stop_ptr)
        free(self.stop_len)
        free(self.notes)

    # ------------------------------------------------------------------ free proposers
    # (typed attributes, so that the loop calls them without the GIL)
    cdef Proposer _fp(self, int i):
        # (typed attributes, not a tuple's item: C compilers that reject an untyped object
        # assigned to a typed one, GCC 14 by default, build this)
        if i == 0:
            return self.fp0
        if i == 1:
            return self.fp1
        if i == 2:
            return self.fp2
        return self.fp3

    cdef inline int _fp_source(self, int i) noexcept nogil:
        if i == 0:
            return self.fp0.source
        if i == 1:
            return self.fp1.source
        if i == 2:
            return self.fp2.source
        return self.fp3.source

    cdef int _fp_propose(self, int i, int cap, int * key) noexcept nogil:
        cdef ll.llama_token * out = self.ptok[i]
        cdef float * conf = self.pconf[i]
        if i == 0:
            return self.fp0.propose(self.seq, self.seq_len, cap, out, conf, key)
        if i == 1:
            return self.fp1.propose(self.seq, self.seq_len, cap, out, conf, key)
        if i == 2:
            return self.fp2.propose(self.seq, self.seq_len, cap, out, conf, key)
        return self.fp3.propose(self.seq, self.seq_len, cap, out, conf, key)

    cdef void _fp_extend(self, int i) noexcept nogil:
        if i == 0:
            self.fp0.extend(self.seq, self.seq_len)
        elif i == 1:
            self.fp1.extend(self.seq, self.seq_len)
        elif i == 2:
            self.fp2.extend(self.seq, self.seq_len)
        else:
            self.fp3.extend(self.seq, self.seq_len)

    cdef void _fp_feedback(self, int i, int k, int a) noexcept nogil:
        if i == 0:
            self.fp0.feedback(k, a)
        elif i == 1:
            self.fp1.feedback(k, a)
        elif i == 2:
            self.fp2.feedback(k, a)
        else:
            self.fp3.feedback(k, a)

    # ------------------------------------------------------------------ setup
    def start(self, prompt_tokens, draft_hints=()):
        """Clear the KV caches and prefill them with the prompt (all but its last token,
        which the first step decodes); start every proposer on it.  ``draft_hints``: token
        ids a draft that computes logits for the leading ids only (``Context.set_n_logits``)
        also gets them for from the start, after the prompt's own (ids it covers, or outside
        the vocabulary, are passed over; at most ``MAX_EXTRA_LOGITS`` extra ids in all)."""
        self.tgt._check()
        if self.drf is not None:
            self.drf._check()
        cdef int n = len(prompt_tokens)
        if n == 0:
            raise ValueError("the prompt is empty (no tokens)")
        if n > self.tgt.n_ctx - 1:
            raise ValueError(f"the prompt has {n} tokens but the context holds {self.tgt.n_ctx} "
                             "(and at least one more is needed to generate); use a larger n_ctx")
        if self.drf is not None and n > self.drf.n_ctx - 1:
            raise ValueError(f"the prompt has {n} tokens but the draft context holds {self.drf.n_ctx}")
        cdef int i
        for i in range(n):
            t = prompt_tokens[i]
            if t < 0 or t >= self.n_vocab:
                raise ValueError(f"prompt token {t} is outside the vocabulary")
            self.seq[i] = t
            self.src[i] = SRC_TARGET
            self.tgap[i] = -1
        self.seq_len = n
        self.n_prompt = n
        if self.draft is not None:
            self.draft.window = self.draft.window_default
        self._index_unread(n)
        for i in range(self.n_free):
            self._fp(i).begin(self.seq, n)
            self.qn[i] = 0
        if self.draft is not None:
            self.draft.begin(self.seq, n)
            if draft_hints:
                self.draft.hint([int(t) for t in draft_hints])
        if self.draft is not None or self.n_free > 0:
            self.acc.new_generation()           # older evidence fades (FREE_KEEP, half)
        self.policy.begin()
        self.n_draft_steps = 0
        self.text_len = 0
        self.text_end = 0
        self.rng = self.seed
        memset(&self.st, 0, sizeof(Stats))
        self.n_notes = 0
        self.notes_lost = False
        self.st.read_all_at = -1
        self.st.draft_first_at = -1
        self.finish = RUNNING
        self.length_noted = False
        self.started = True
        cdef int64_t t0 = ll.llama_time_us(), dt
        self.tgt.clear()
        self._prefill(self.tgt, n - 1)
        self.st.t_prefill_us = ll.llama_time_us() - t0
        if self.drf is not None:
            # the draft keeps what it holds of the prompt from the generation before (a chat
            # template's system prompt, a conversation's earlier turns): its KV only shapes
            # proposals, never the output.  (The target always starts empty, so that every
            # run decodes the prompt the same way and greedy outputs stay comparable.)
            self.drf._keep_prefix(self.seq, n - 1)
            if not self.adaptive:
                # a cost of speculating, not of the prompt (the target alone does not pay it):
                # it counts as drafting time, as an adaptive draft's catch-up does
                t0 = ll.llama_time_us()
                self._prefill(self.drf, n - 1)
                dt = ll.llama_time_us() - t0
                self.st.t_draft_us += dt
                self.st.t_total_us += dt
            # adaptive: the draft model reads the prompt only if and when the policy first
            # runs it (its catch-up), so a draft that does not pay here costs no prefill

    cdef _prefill(self, Context c, int n):
        """Decode seq[c.n_past:n] into ``c`` in n_batch chunks, checking for Ctrl-C between them."""
        cdef int done = c.n_past, m, rc
        while done < n:
            m = min(n - done, c.n_batch)
            with nogil:
                rc = c._decode(self.seq + done, m, m)
            if rc != 0:
                self.started = False
                raise RuntimeError(f"llama_decode failed with code {rc} during prefill")
            done += m
            PyErr_CheckSignals()

    def calibrate(self, int max_n=0):
        """Time target decodes of each batch size the adaptive mode may verify (1 up to
        ``max_n``, default n_draft + 1: every size to 9, three times, then 12, 13, 16, 17,
        ... twice; sizes in between are interpolated), each against the one-token passes
        timed beside it, and one draft-model token, into the cost model, and
        mark it calibrated.  Call after start(); the target's KV cache is left as it was;
        a draft model that has not read the prompt yet reads part of it while being timed.
        Without it, sizes are learned as used, which never reveals that, on a CPU, a
        batch of 4 can cost less than one of 3."""
        self._check_started()
        if max_n <= 0:
            max_n = min(self.n_draft_max, MAX_DRAFT) + 1
            if self.max_verify > 0 and max_n > self.max_verify:
                max_n = self.max_verify        # larger batches are never verified
        cdef int pending_pos = self.seq_len - 1
        cdef int n, j, p, m
        cdef double secs
        cdef int64_t c0 = ll.llama_time_us()
        fit = min(self.tgt.n_ctx - pending_pos, MAX_DRAFT + 1)
        draft_ratios = []
        plan = calibration_rounds(max_n, fit)
        sizes = plan[0]
        for j in range(MAX_DRAFT + 1):      # any tokens time the same: the pending one, repeated
            self._vbatch[j] = self.seq[pending_pos]
        if fit >= 1:
            self._timed_verify(1)           # the first decode warms caches: not kept
            if self.tgt.model.on_gpu:
                # a GPU backend's first passes of a batch size pay one-off costs several times
                # the pass itself: its kernels' first launch, and on CUDA the graph's capture,
                # which ggml makes on a shape's second pass and replays from the third; the
                # long sizes below are timed twice, and a size timed dear is never tried again;
                # the one-token shape too, else the rounds' first reference would be its capture
                for j in range(GPU_WARMUPS):
                    for n in [1] + sizes:
                        self._timed_verify(n)
            # rounds (calibration_rounds): the short sizes, which the policy weighs most
            # often, three times, the long ones twice, each round between two one-token
            # passes; a size is kept as its least ratio to its round's one-token time, so
            # that a slow spell of the machine weighs on a size and its reference alike and
            # outside load on the size alone cannot make it look too dear to ever be tried
            # (a size not used is not timed again; see calibrated_costs)
            rounds = []
            for taking in plan:
                before = self._timed_verify(1)
                taken = {n: self._timed_verify(n) for n in taking}
                rounds.append((before, taken, self._timed_verify(1)))
            self.cost.context = pending_pos
            for n, secs in sorted(calibrated_costs(rounds).items()):
                self.cost.observe_verify(n, secs, pending_pos)
        if self.drf is not None and self.drf.n_past < pending_pos:
            # the draft model has not read the prompt (it does when first run): time what it
            # costs on the prompt's own tokens, which it keeps -- one-token decodes (the first
            # warms up), then a batch for the per-token cost of catching up
            p = self.drf.n_past
            if pending_pos - p >= 3:
                self._time_draft_tokens(p, True, draft_ratios)
                self.cost.observe_draft_ratio(statistics.median(draft_ratios))
                p += 3
                if pending_pos - p >= 2:        # two tokens behind: as after an all-accepted pass
                    self._warm_draft(p, 2)
                    self.cost.observe_catchup(2, self._timed_decode(self.drf, &self.seq[p], 2, 1))
                    p += 2
                m = min(pending_pos - p, 64)
                if m >= 16:
                    self._warm_draft(p, m)
                    self.cost.observe_catchup(m, self._timed_decode(self.drf, &self.seq[p], m, m - 1))
            else:
                self._timed_decode(self.drf, &self.seq[p], pending_pos - p, pending_pos - p)
        if self.drf is not None and self.drf.n_past == pending_pos and pending_pos + 1 < self.drf.n_ctx:
            self._time_draft_tokens(pending_pos, False, draft_ratios)
            # each draft token against a target one-token pass timed right after it, the median
            # of all: the draft's cost ratio c as the policy prices it
            self.cost.observe_draft_ratio(statistics.median(draft_ratios))
        self.cost.calibrated = True
        self.policy.refresh()
        self.st.t_calibrate_us += ll.llama_time_us() - c0

    cdef int _warm_draft(self, int pos, int n) except -1:
        """On a GPU backend, decode seq[pos:pos + n] into the draft GPU_WARMUPS times, taking
        it back each time, so that the timed decode of the same shape after them pays no
        first-launch or capture costs."""
        cdef int j
        if self.drf.model.on_gpu:
            for j in range(GPU_WARMUPS):
                try:
                    self._timed_decode(self.drf, &self.seq[pos], n, n - 1)
                finally:
                    self.drf._remove_from(pos)
        return 0

    cdef int _time_draft_tokens(self, int pos, bint keep, list ratios) except -1:
        """Three one-token draft-model decodes (the first warms up), each after the first
        timed against a target one-token pass right after it, the ratios appended to
        ``ratios``: of seq[pos], seq[pos + 1], seq[pos + 2], kept in the draft's cache
        (``keep``: prompt tokens it has to read anyway), or of seq[pos] three times, taken
        back each time."""
        cdef int j, at
        cdef double secs
        self._warm_draft(pos, 1)            # on a GPU: the one-token shape's launch and capture
        for j in range(3):
            at = pos + j if keep else pos
            try:
                secs = self._timed_decode(self.drf, &self.seq[at], 1, 0)
            finally:
                if not keep:
                    self.drf._remove_from(at)
            if j > 0:
                ratios.append(secs / self._timed_verify(1))
        return 0

    cdef double _timed_verify(self, int n) except -1.0:
        """Seconds one target decode of n tokens (the batch prepared in _vbatch, logits at
        every position) took; the cache is left as it was; Ctrl-C stops here."""
        cdef int pending_pos = self.seq_len - 1
        try:
            secs = self._timed_decode(self.tgt, self._vbatch, n, 0)
        finally:
            self.tgt._remove_from(pending_pos)
        PyErr_CheckSignals()
        return secs

    cdef double _timed_decode(self, Context c, const ll.llama_token * toks, int n, int logits_from) except -1.0:
        """Seconds one decode of n tokens into ``c`` took (calibration); raises if it failed."""
        cdef int64_t t0, t1
        cdef int rc
        with nogil:
            t0 = ll.llama_time_us()
            rc = c._decode(toks, n, logits_from)
            t1 = ll.llama_time_us()
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} while calibrating")
        return (t1 - t0) * 1e-6

    # ------------------------------------------------------------------ running
    def run(self):
        """Generate until a finish condition.  Ctrl-C stops between two target passes."""
        self._check_started()
        while self.finish == RUNNING:
            with nogil:
                self._step()
            self._note_finish()
            PyErr_CheckSignals()
        return FINISH_REASONS[self.finish]

    cdef void _note_finish(self):
        """Once a generation has ended, tell the acceptance model how long it ran (what
        later probes' evidence and catch-ups can serve).  One that ended by itself (end of
        generation, a stop string) is a length; one cut by max_tokens only says that it
        would have run at least that long: it counts where that is longer than the usual
        length (code after chat: the long answers must not be left out of the mean), and
        not before a generation has ended by itself (a short warm-up is no length).  Where the
        draft model ran beside free proposers, also what share of it they made."""
        if self.finish != RUNNING and not self.length_noted:
            self.length_noted = True
            if self.draft is None and self.n_free == 0:
                return
            if self.draft is not None and self.n_free > 0 and self.st.n_generated >= FREE_SHARE_MIN:
                self.acc.observe_free_share(self._free_made() / <double>self.st.n_generated,
                                            self._long_prompt())
            if self.draft is not None and self.copy_seen:
                self.acc.observe_copies(self.copy_all_max >= COPY_RUN_MIN)
            if self.finish in (FIN_EOG, FIN_STOP):
                self.acc.observe_length(self.st.n_generated)
            elif (self.finish == FIN_MAX_TOKENS and self.acc.len_n > 0
                    and self.st.n_generated > self.acc.len_mean):
                self.acc.observe_length(self.st.n_generated)
            elif self.finish == FIN_MAX_TOKENS and self.acc.len_n == 0:
                self.acc.observe_cut(self.st.n_generated)

    def step(self):
        """One target pass; returns (tokens, sources) emitted by it ([] once finished)."""
        self._check_started()
        if self.finish != RUNNING:
            return [], []
        cdef int before = self.seq_len
        with nogil:
            self._step()
        self._note_finish()
        cdef int n = self.n_emitted_last
        return ([self.seq[i] for i in range(before, before + n)],
                [self.src[i] for i in range(before, before + n)])

    def _check_started(self):
        if not self.started:
            raise RuntimeError("call start(prompt_tokens) first")
        self.tgt._check()
        if self.drf is not None:
            self.drf._check()

    cdef int _choose(self, int cap, int remaining, int * k_out, double * e_out, double * t_out) noexcept nogil:
        """The policy: which proposal this pass verifies, and how many of its tokens.
        Returns CH_TARGET, CH_DRAFT or a free proposer's index; k_out (free proposals),
        and what the pass is expected to give: e_out tokens in t_out seconds."""
        cdef int i, n, key, kk, s, choice = CH_TARGET, k = 0, n_behind = 0, n_read, n_all
        cdef double r, ee, best_r, t_fix = 0.0, future, draft_future = 0.0, bet, t_all, mean_all
        cdef bint read_all = False
        self.policy.refresh()
        best_r = 1.0 / self.policy.t1
        memset(&self.note, 0, sizeof(PassNote))
        self.note.rate_target = best_r
        e_out[0] = 1.0
        t_out[0] = self.policy.t1
        # every free proposer proposes (microseconds); keep the best at its best length
        for i in range(self.n_free):
            self.pn[i] = 0
            if cap <= 0:
                continue
            key = 0
            n = self._fp_propose(i, cap, &key)
            if n <= 0:
                continue
            if n > cap:
                n = cap
            if key < 0:
                key = 0
            if key >= N_KEYS:
                key = N_KEYS - 1
            s = self._fp_source(i)
            self.pn[i] = n
            self.pkey[i] = key
            self.policy.count_offer(s, key)
            if not self.adaptive:
                if choice == CH_TARGET:          # fixed n_draft: the first proposal, whole
                    choice = i
                    k = n
                continue
            r = self.policy.free_choice(s, key, self.pconf[i], n, &kk, &ee)
            if kk < self.n_draft_min <= n:
                kk = self.n_draft_min
                ee = self.policy.expect_free(s, key, self.pconf[i], kk)
                r = ee / self.policy.tv[kk + 1]
            # what this proposer's passes have really delivered against their prediction
            r *= self.policy.corr[s]
            if r > best_r and kk > 0:
                best_r = r
                choice = i
                k = kk
                e_out[0] = ee
                t_out[0] = self.policy.tv[kk + 1]
        # the draft model, at the acceptance seen so far
        if self.draft is not None and cap > 0:
            self.draft.probe_k = 0
            n_behind = self.seq_len - self.drf.n_past
            n_read = self.draft.catchup_len(n_behind)
            t_fix = self.policy.draft_fixed(n_read)
            # it reads (or its catch-up would read) only a window of the prompt
            self.policy.draft_windowed = self.draft.window > 0 and (self.drf.n_skip > 0 or n_read < n_behind)
            self.policy.draft_unread = (self.draft.unread_share(self.seq_len, self.n_prompt)
                                        if self.policy.draft_windowed else 0.0)
            if not self.adaptive:
                if choice == CH_TARGET:
                    choice = CH_DRAFT
            else:
                # catching up is paid once, for every pass left: spread it over the tokens this
                # generation is expected to run on
                draft_future = self.acc.future(self.st.n_generated, remaining)
                if self.n_free > 0:         # (of which the free proposers make their share)
                    draft_future *= 1.0 - self._free_share()
                self.note.draft_mean = self.policy.draft_mean()
                self.note.draft_read = n_read
                # a windowed draft's long read (its window, or all of the prompt) is a bet on
                # this answer's length: over no more tokens than it has run
                bet = (self.acc.one_off_future(self.st.n_generated, draft_future)
                       if self.policy.draft_windowed else draft_future)
                future = bet if n_read > CATCHUP_SMALL else draft_future
                self.note.draft_future = future
                r = self._draft_rate(self.note.draft_mean, cap,
                                     t_fix * (WINDOW_CATCHUP_MARGIN if self.policy.draft_windowed else 1.0),
                                     future)
                self.note.rate_draft = r
                if self.policy.draft_start_pays(r, best_r, n_read):
                    best_r = r
                    choice = CH_DRAFT
                # a windowed draft: reading all of the prompt costs more once, and makes its
                # acceptance what the target's certainty says without the window's factor,
                # the copies from the part it skipped included
                if self.policy.draft_windowed:
                    n_all = self.draft.unread_len(self.seq_len)
                    t_all = self.policy.draft_fixed(n_all)
                    mean_all = self.policy.draft_mean_reading_all()
                    future = bet
                    if self.copy_run >= COPY_RUN_MIN and self.n_prompt - self.copy_next > future:
                        # copying the prompt at length: likely on to the end of its source
                        future = min(self.n_prompt - self.copy_next, remaining)
                    elif self.copy_seen and self.st.n_generated < COPY_RUN_MIN and draft_future > bet:
                        # before this answer can show a run of copies: as often as recent long
                        # prompts' answers copied theirs at length, it runs as long as expected
                        future = bet + self.acc.copy_mean * (draft_future - bet)
                    r = self._draft_rate(mean_all, cap, t_all, future)
                    if r > best_r:
                        best_r = r
                        choice = CH_DRAFT
                        read_all = True
                        t_fix = t_all
                        self.note.read_all = 1
                        self.note.rate_draft = r
                        self.note.draft_mean = mean_all
                        self.note.draft_future = future
                        self.note.draft_read = n_all
        if read_all:
            self.draft.read_all()
            self.policy.draft_windowed = False
            self.policy.draft_unread = 0.0
            self.policy.copies_read()
            self.st.n_read_all = 1
            self.st.read_all_at = self.st.n_generated
        if self.adaptive and choice == CH_TARGET:
            # nothing pays on what is known: try one anyway if that is worth its cost
            # (not on an answer's first tokens: the opening is what a draft guesses worst,
            # evidence from it misleads; a few tokens on, the catch-up's looks bring more)
            if (self.draft is not None and cap > 0 and self.st.n_generated >= DRAFT_PROBE_AFTER
                    and self.policy.worth_probe(SRC_DRAFT, 0, cap, t_fix, self.policy.td, draft_future,
                                                self.draft.look_len(self.seq_len, n_behind), &kk)):
                choice = CH_DRAFT
                self.draft.probe_k = kk
                self.policy.count_probe(SRC_DRAFT)
                self.note.probe = 1
            elif self.seq_len > self.n_prompt:
                # (not at an answer's first token: a proposal there is offered once per
                # answer, so what a probe of it learns serves none of this answer's passes,
                # and greedy, _shadow_free learns the same from the target's token at no
                # cost; on multi-turn chat such probes failed on most conversations)
                for i in range(self.n_free):
                    if self.pn[i] <= 0:
                        continue
                    s = self._fp_source(i)
                    key = self.pkey[i]
                    # the tokens this generation is expected to run on (not max_tokens: a
                    # short answer's probe serves few), as often as this proposer offers
                    future = (self.acc.future(self.st.n_generated, remaining)
                              * (self.policy.offers(s, key) / (self.st.n_passes + 1.0)))
                    if self.policy.worth_probe(s, key, self.pn[i], 0.0, 0.0, future, 0, &kk):
                        if kk > self.pn[i]:
                            kk = self.pn[i]
                        choice = i
                        k = kk
                        e_out[0] = self.policy.expect_free(s, key, self.pconf[i], kk)
                        t_out[0] = self.policy.tv[kk + 1]
                        self.policy.count_probe(s)
                        self.note.probe = 1
                        break
        if self.adaptive:
            # evidence about what was passed over fades a little (text changes)
            for i in range(self.n_free):
                if self.pn[i] > 0 and choice != i:
                    self.acc.fade(self._fp_source(i), self.pkey[i], 0.99)
            if self.draft is not None and choice != CH_DRAFT and cap > 0:
                self.acc.fade(SRC_DRAFT, 0, 0.99)
        if choice >= 0 and not self.adaptive:
            e_out[0] = self.policy.expect_free(self._fp_source(choice), self.pkey[choice], self.pconf[choice], k)
            t_out[0] = self.policy.tv[k + 1]
        if choice == CH_DRAFT:
            t_out[0] = t_fix        # the rest once drafted
        self.note.rate_best = best_r
        k_out[0] = k
        return choice

    cdef inline int64_t _free_made(self) noexcept nogil:
        """Tokens of this generation that free proposers' passes made."""
        cdef int i
        cdef int64_t f = 0
        for i in range(self.n_free):
            f += self.st.emitted_by_src[self._fp_source(i)]
        return f

    cdef inline bint _long_prompt(self) noexcept nogil:
        """Whether this generation's prompt is long (LONG_PROMPT_TOKENS: what a windowed draft
        reads of it is its head and last window); the free proposers' share of recent answers
        is kept apart for such prompts (AcceptanceModel.free_share_of)."""
        return self.n_prompt > LONG_PROMPT

    cdef inline double _free_share(self) noexcept nogil:
        """The share of this generation's tokens the free proposers are expected to make
        (see FREE_SHARE_N)."""
        cdef double p0 = self.acc.free_of(self._long_prompt())
        return (self._free_made() + FREE_SHARE_N * p0) / (self.st.n_generated + FREE_SHARE_N)

    cdef inline double _draft_rate(self, double mean, int cap, double t_fix, double future) noexcept nogil:
        """Tokens per second the draft model promises at acceptance ``mean`` (best length up
        to cap), its one-off catch-up t_fix spread over the ``future`` tokens expected, at
        its realized correction and DRAFT_MARGIN."""
        cdef int k
        cdef double r = self.policy.best_const(mean, cap, 0.0, self.policy.td, &k)
        if r > 0.0 and t_fix > 0.0:
            r = 1.0 / (1.0 / r + t_fix / future)
        return r * self.policy.corr[SRC_DRAFT] / DRAFT_MARGIN

    cdef void _step(self) noexcept nogil:
        cdef int64_t t0 = ll.llama_time_us(), t1, t2
        cdef int pending_pos = self.seq_len - 1
        cdef int room = self.tgt.n_ctx - pending_pos        # tokens the target can still take
        cdef int remaining = self.max_tokens - self.st.n_generated
        cdef int j, k = 0, key = 0, choice, source = SRC_TARGET
        cdef int at = <int>self.st.n_generated
        cdef double e_pred, t_pred
        self.n_emitted_last = 0
        self.cost.context = pending_pos        # what this pass's queries read: costs depend on it
        if remaining <= 0:
            self.finish = FIN_MAX_TOKENS
            return
        if room < 1 or self.seq_len >= self.seq_cap:
            self.finish = FIN_CONTEXT
            return
        cdef int cap = self.n_draft_max
        if cap > room - 1:
            cap = room - 1
        if cap > remaining - 1:
            cap = remaining - 1
        if self.max_verify > 0 and cap > self.max_verify - 1:
            cap = self.max_verify - 1
        cdef int n_behind = self.draft.catchup_len(self.seq_len - self.drf.n_past) if self.drf is not None else 0
        choice = self._choose(cap, remaining, &k, &e_pred, &t_pred)
        if choice == CH_DRAFT:
            k = self.draft.propose(self.seq, self.seq_len, cap, self.dtok, self.dconf, &key)
            if k < 0:
                self.finish = FIN_ERROR
                return
            source = SRC_DRAFT
            e_pred = self.draft.last_e
            # (a token it decoded and then dropped cost a decode too: a run that proposed
            # nothing is a decode and a one-token pass)
            t_pred += (k + self.draft.n_dropped) * self.policy.td + self.policy.tv[k + 1]
            if self.st.draft_first_at < 0:
                self.st.draft_first_at = self.st.n_generated
            self.n_draft_steps += 1
            if k == 0:
                self.st.n_draft_empty += 1
        elif choice >= 0:
            source = self._fp_source(choice)
            key = self.pkey[choice]
            for j in range(k):
                self.dtok[j] = self.ptok[choice][j]
                self.dconf[j] = self.pconf[choice][j]
        for j in range(k):
            self.dsrc[j] = source
        t1 = ll.llama_time_us()
        # verification batch: pending token + k proposed tokens, logits at every position
        self._vbatch[0] = self.seq[pending_pos]
        for j in range(k):
            self._vbatch[j + 1] = self.dtok[j]
        cdef int rc = self.tgt._decode(self._vbatch, k + 1, 0)
        if rc != 0:
            self.finish = FIN_ERROR
            return
        t2 = ll.llama_time_us()
        self.cost.observe_verify(k + 1, (t2 - t1) * 1e-6, pending_pos)
        self.st.passes_by_size[k + 1] += 1
        if k == 0:
            self.st.n_one += 1
            self.st.t_one_us += t2 - t1
        cdef int len_before = self.seq_len
        cdef int a = self._accept(k)
        # trim the target's cache to what was kept: pending + a accepted tokens
        self.tgt._remove_from(pending_pos + a + 1)
        if k > 0:
            if choice >= 0:
                self.policy.observe_free(source, key, self.dconf, k, a)
                self._fp_feedback(choice, k, a)
            else:
                self.acc.observe(source, key, k, a)
        elif choice == CH_DRAFT:
            # the draft ran but offered nothing worth verifying: as far as the choice to
            # run it goes, that is a token not accepted
            self.acc.observe(SRC_DRAFT, 0, 1, 0)
        if self.greedy and self.adaptive:
            self._shadow_free(choice, len_before)
        # every proposer follows the sequence (the draft trims its cache)
        if self.draft is not None:
            self.draft.extend(self.seq, self.seq_len)
        for j in range(self.n_free):
            self._fp_extend(j)
        t2 = ll.llama_time_us()
        self.policy.predict(source, e_pred, t_pred)
        if source != SRC_TARGET and self.adaptive and not self.cost.hold:
            if source == SRC_DRAFT:
                # a long catch-up (after a pause) is a one-off: not part of what drafting
                # delivers per pass; a short one (a token or two behind) is
                self.acc.observe_pass(source, e_pred,
                                      t_pred - (self.policy.draft_fixed(n_behind) if n_behind > CATCHUP_SMALL else 0.0),
                                      a + 1, (t2 - t0) * 1e-6 - self.draft.t_catchup)
            else:
                self.acc.observe_pass(source, e_pred, t_pred, a + 1, (t2 - t0) * 1e-6)
        self.st.passes_by_src[source] += 1
        self.st.t_draft_us += t1 - t0
        self.st.t_verify_us += t2 - t1
        self.st.t_total_us += t2 - t0
        self.st.n_passes += 1
        if self.tracing:
            self.note.at = at
            self.note.source = source
            self.note.k = k
            self.note.accepted = a
            self.note.emitted = self.n_emitted_last
            self.note.e_pred = e_pred
            self.note.t_pred = t_pred
            self.note.t = (t2 - t0) * 1e-6
            self._keep_note()

    cdef void _keep_note(self) noexcept nogil:
        """Append this pass's note to the trace (doubling its room as it fills; where memory
        runs out the trace stops growing: ``trace`` raises MemoryError)."""
        cdef int cap
        cdef PassNote * grown
        if self.n_notes == self.notes_cap:
            cap = 64 if self.notes_cap == 0 else 2 * self.notes_cap
            grown = <PassNote *>realloc(self.notes, cap * sizeof(PassNote))
            if grown == NULL:
                self.notes_lost = True
                return
            self.notes = grown
            self.notes_cap = cap
        self.notes[self.n_notes] = self.note
        self.n_notes += 1

    cdef void _shadow_free(self, int choice, int start) noexcept nogil:
        """Greedy: the tokens the passes emit are the target's own whatever they verified,
        so a free proposal that was not verified is checked against them as they come, at
        no cost: its first SHADOW_CHECK tokens, up to its first miss, are evidence of its
        proposer as if they had been verified.  One such proposal per proposer at a time
        (the next is taken once it is settled); the passes that emit one token settle it
        over the following passes.  A proposer thus learns how it does on this text while
        the target runs alone or another proposer runs: without it, lookup set aside for a
        draft that its carried evidence ranked higher was never tried again on an answer
        it could have copied, and a proposer whose record from other texts over-promises
        here kept being verified (multi-turn runs: two-token lookup and suffix passes on
        chat answers, half of them kept).  ``start``: where this pass's tokens begin."""
        cdef int j, m, n
        for j in range(self.n_free):
            if self.qn[j] == 0 and j != choice and self.pn[j] > 0:
                n = self.pn[j] if self.pn[j] < SHADOW_CHECK else SHADOW_CHECK
                for m in range(n):
                    self.qtok[j][m] = self.ptok[j][m]
                    self.qconf[j][m] = self.pconf[j][m]
                self.qn[j] = n
                self.qm[j] = 0
                self.qkey[j] = self.pkey[j]
                self.qpos[j] = start
            n = self.qn[j]
            if n == 0:
                continue
            m = self.qm[j]
            while m < n and self.qpos[j] + m < self.seq_len and self.seq[self.qpos[j] + m] == self.qtok[j][m]:
                m += 1
            self.qm[j] = m
            if m == n:                                   # all checked tokens right
                self.policy.observe_free(self._fp_source(j), self.qkey[j], self.qconf[j], n, n)
                self.qn[j] = 0
            elif self.qpos[j] + m < self.seq_len:        # a miss at m
                self.policy.observe_free(self._fp_source(j), self.qkey[j], self.qconf[j], m + 1, m)
                self.qn[j] = 0

    # ------------------------------------------------------------------ verifying
    cdef int _accept(self, int k) noexcept nogil:
        """Compare the k drafted tokens with the target's logits in the last decode, emit
        the accepted prefix and one target token.  Returns the number accepted."""
        cdef int j, a = 0, t = -1, d, i
        cdef float * logits
        cdef float * q
        cdef float pd, qd
        cdef bint ok
        cdef int8_t tg[MAX_DRAFT + 1]       # the target's certainty at each row (tracked: greedy)
        for j in range(k + 1):
            tg[j] = -1
        for j in range(k):
            logits = self.tgt._logits(j)
            d = self.dtok[j]
            if self.greedy:
                t = self._greedy_pick(logits, &tg[j])
                ok = t == d
            else:
                shape_probs(logits, self.n_vocab, &self.sp, self.p_buf, self.scratch)
                pd = self.p_buf[d]
                if self.dsrc[j] == SRC_DRAFT:
                    q = self.draft.q_row(j)
                    qd = q[d]
                else:
                    q = NULL
                    qd = 1.0
                if self.biased_rule:
                    # the right acceptance test, but a rejection resampled from p instead of
                    # the residual max(0, p - q): looks plausible, is wrong
                    ok = rng_uniform(&self.rng) * qd < pd
                    if not ok:
                        t = sample_dense(self.p_buf, self.n_vocab, &self.rng)
                        q = NULL
                        qd = -1.0
                else:
                    ok = rng_uniform(&self.rng) * qd < pd
                if not ok and qd >= 0.0:
                    # residual distribution norm(max(0, p - q))
                    if q != NULL:
                        for i in range(self.n_vocab):
                            self.p_buf[i] = self.p_buf[i] - q[i] if self.p_buf[i] > q[i] else 0.0
                    else:
                        self.p_buf[d] = 0.0
                    t = sample_dense(self.p_buf, self.n_vocab, &self.rng)
            if self.dsrc[j] == SRC_DRAFT:
                # (a copy's certainty does not teach the table either: see COPY_NGRAM; a copy
                # is the target's token's, kept or not)
                self.seq[self.seq_len + j] = t if self.greedy else d    # (where it goes if kept)
                self.policy.observe_draft_token(self.dconf[j], ok,
                    TGAP_COPY if self._copy_check() and copy_source(&self.unread, self.seq, self.seq_len + j) >= 0 else tg[j])
            if not ok:
                self.st.n_rejected += 1
                break
            a += 1
        self.st.n_drafted += k
        self.st.n_accepted += a
        for j in range(k):
            self.st.drafted_by_pos[j] += 1
            self.st.drafted_by_src[self.dsrc[j]] += 1
        for j in range(a):
            self.st.accepted_by_pos[j] += 1
            self.st.accepted_by_src[self.dsrc[j]] += 1
        if a == k:
            logits = self.tgt._logits(k)
            if self.greedy:
                t = self._greedy_pick(logits, &tg[k])
            else:
                shape_probs(logits, self.n_vocab, &self.sp, self.p_buf, self.scratch)
                t = sample_dense(self.p_buf, self.n_vocab, &self.rng)
        for j in range(a):
            if not self._emit(self.dtok[j], self.dsrc[j], tg[j]):
                return a
        self._emit(t, SRC_TARGET, tg[a])
        return a

    cdef inline int _greedy_pick(self, const float * logits, int8_t * tg) noexcept nogil:
        """The target's greedy token from a row of logits; where the draft's agreement by the
        target's certainty is tracked, that certainty's bucket into tg[0] (the same scan)."""
        cdef float gap
        if not self.track_tgap:
            return argmax(logits, self.n_vocab)
        cdef int t = argmax_gap(logits, self.n_vocab, &gap)
        tg[0] = tgap_bucket(gap)
        return t

    cdef void _index_unread(self, int n) noexcept nogil:
        ngram_free(&self.unread)
        self.copy_run = 0
        self.copy_all_run = 0
        self.copy_all_gap = 0
        self.copy_all_next = -1
        self.copy_all_max = 0
        self.copy_next = -1
        self.copy_gap = 0
        self.copy_seen = (self.track_tgap and self.draft.window > 0
                          and index_unread(&self.unread, self.seq, n) > 0)

    cdef inline bint _copy_check(self) noexcept nogil:
        """Whether a copy from the unread prompt is kept apart as no evidence of the draft: the
        index is built and the draft has not read all of the prompt (copies still count for
        the runs after it has)."""
        return self.copy_seen and self.st.n_read_all == 0

    cdef bint _emit(self, int tok, int source, int tgap) noexcept nogil:
        """Append one token (the target emitted it with certainty bucket tgap, -1 if not
        known); returns False once generation has finished."""
        if self.finish != RUNNING:
            return False
        if ll.llama_vocab_is_eog(self.tgt.model.vocab, tok):
            self.finish = FIN_EOG
            self.st.n_eog = 1
            return False
        self.seq[self.seq_len] = tok
        self.src[self.seq_len] = source
        cdef int v = copy_source(&self.unread, self.seq, self.seq_len) if self.copy_seen else -1
        copy_step(run_copy(v, source), &self.copy_run, &self.copy_next, &self.copy_gap)
        copy_step(v, &self.copy_all_run, &self.copy_all_next, &self.copy_all_gap)
        if self.copy_all_run > self.copy_all_max:
            self.copy_all_max = self.copy_all_run
        if tgap >= 0 and v >= 0 and self._copy_check():
            self.policy.note_copy_token(tgap)   # (evidence only if the draft reads it all)
            tgap = TGAP_COPY                    # a copy: no evidence of the draft (COPY_NGRAM)
            self.st.n_copied += 1
        self.tgap[self.seq_len] = tgap
        self.policy.note_target_token(tgap)
        self.seq_len += 1
        self.n_emitted_last += 1
        self.st.n_generated += 1
        self.st.emitted_by_src[source] += 1
        self._append_text(tok)
        if self.finish == RUNNING and self.st.n_generated >= self.max_tokens:
            self.finish = FIN_MAX_TOKENS
        return self.finish == RUNNING

    cdef void _append_text(self, int tok) noexcept nogil:
        cdef char buf[256]
        cdef int n = ll.llama_token_to_piece(self.tgt.model.vocab, tok, buf, sizeof(buf), 0, False)
        cdef int start, i, s
        if n <= 0:
            return
        if self.text_len + n > self.text_cap:
            self.text_cap = (self.text_len + n) * 2
            self.text = <char *>realloc(self.text, self.text_cap)
        start = self.text_len
        memcpy(self.text + self.text_len, buf, n)
        self.text_len += n
        self.text_end = self.text_len
        for s in range(self.n_stops):
            i = start - self.stop_len[s] + 1
            if i < 0:
                i = 0
            while i + self.stop_len[s] <= self.text_len:
                if self.text[i] == self.stop_ptr[s][0] and \
                        _bytes_eq(self.text + i, self.stop_ptr[s], self.stop_len[s]):
                    if i < self.text_end or self.finish != FIN_STOP:
                        self.text_end = i
                    self.finish = FIN_STOP
                    break
                i += 1

    # ------------------------------------------------------------------ results
    @property
    def tokens(self):
        """Generated tokens so far (end-of-generation token excluded)."""
        return [self.seq[i] for i in range(self.n_prompt, self.seq_len)]

    @property
    def sources(self):
        """For each generated token its source id (an index of SOURCE_NAMES)."""
        return [self.src[i] for i in range(self.n_prompt, self.seq_len)]

    @property
    def text_bytes(self):
        """Generated text, cut where a stop string begins."""
        return self.text[:self.text_end]

    @property
    def safe_text_len(self):
        """Bytes of text that no later stop string can take back."""
        if self.finish != RUNNING or self.n_stops == 0:
            return self.text_end
        return max(0, self.text_end - self.max_stop_len + 1)

    @property
    def finish_reason(self):
        return FINISH_REASONS[self.finish]

    @property
    def prompt_tokens(self):
        return self.n_prompt

    @property
    def draft_trimmed(self):
        """Whether this generator drafts with a model that computes logits for the leading
        ids only (where ``start``'s ``draft_hints`` apply)."""
        return self.draft is not None and self.draft.trimmed()

    @property
    def trace(self):
        """With ``trace=True``: one dict a target pass, in order: the tokens generated
        before it (``at``), what the policy chose (``source``, ``k`` tokens, ``probe``), what
        it expected (``expected_tokens`` in ``expected_seconds``) and what came of it
        (``accepted``, ``emitted``, ``seconds``); the promises it weighed in tokens per
        second (``target_rate``, ``best_rate``, ``draft_rate``, 0 where the draft was not
        weighed) and, for the draft model, the acceptance it was reckoned at
        (``draft_acceptance``), the tokens the answer was expected to run on
        (``draft_future``), the tokens it had to read first (``draft_read``) and whether a
        windowed draft was set to read all of the prompt there (``draft_read_all``).  None
        without ``trace=True``."""
        if not self.tracing:
            return None
        if self.notes_lost:
            raise MemoryError("the pass trace ran out of memory")
        cdef int i
        cdef PassNote n
        out = []
        for i in range(self.n_notes):
            n = self.notes[i]
            out.append({
                "at": n.at, "source": SOURCE_NAMES[n.source], "k": n.k, "accepted": n.accepted,
                "emitted": n.emitted, "probe": bool(n.probe),
                "expected_tokens": n.e_pred, "expected_seconds": n.t_pred, "seconds": n.t,
                "target_rate": n.rate_target, "best_rate": n.rate_best, "draft_rate": n.rate_draft,
                "draft_acceptance": n.draft_mean, "draft_future": n.draft_future,
                "draft_read": n.draft_read, "draft_read_all": bool(n.read_all),
            })
        return out

    def stats(self):
        cdef Stats s = self.st
        k = min(self.n_draft_max, MAX_DRAFT)
        pred = self.policy.predicted()
        pred_tokens = sum(v[0] for v in pred.values())
        pred_time = sum(v[1] for v in pred.values())
        t1 = self.cost.t_verify(1)
        return {
            "n_generated": s.n_generated,
            "n_eog": s.n_eog,
            "n_drafted": s.n_drafted,
            "n_accepted": s.n_accepted,
            "n_rejected": s.n_rejected,
            "n_passes": s.n_passes,
            "drafted_by_pos": [s.drafted_by_pos[i] for i in range(k)],
            "accepted_by_pos": [s.accepted_by_pos[i] for i in range(k)],
            "drafted_by_source": {SOURCE_NAMES[i]: s.drafted_by_src[i] for i in range(N_SOURCES)},
            "accepted_by_source": {SOURCE_NAMES[i]: s.accepted_by_src[i] for i in range(N_SOURCES)},
            "emitted_by_source": {SOURCE_NAMES[i]: s.emitted_by_src[i] for i in range(N_SOURCES)},
            "passes_by_source": {SOURCE_NAMES[i]: s.passes_by_src[i] for i in range(N_SOURCES)},
            "passes_by_size": {i: s.passes_by_size[i] for i in range(1, MAX_DRAFT + 2) if s.passes_by_size[i]},
            "probes_by_source": {SOURCE_NAMES[i]: self.policy.n_probes[i] for i in range(N_SOURCES)},
            "calibration_by_source": {SOURCE_NAMES[i]: self.policy.calib[i] for i in range(N_SOURCES)},
            "predicted_by_source": pred,
            "predicted_tokens_per_second": pred_tokens / pred_time if pred_time > 0 else 0.0,
            "predicted_target_tokens_per_second": 1.0 / t1 if (t1 > 0 and self.cost.calibrated) else 0.0,
            "t_prefill": s.t_prefill_us * 1e-6,
            "t_draft": s.t_draft_us * 1e-6,
            "t_verify": s.t_verify_us * 1e-6,
            "t_generate": s.t_total_us * 1e-6,
            "n_draft_decodes": self.draft.n_decodes if self.draft is not None else 0,
            "n_draft_looked": self.draft.n_looked if self.draft is not None else 0,
            "n_draft_steps": self.n_draft_steps,
            "n_draft_empty": s.n_draft_empty,
            "n_copied_unread": s.n_copied,
            "draft_read_all": s.n_read_all,
            "draft_read_all_at": s.read_all_at,     # tokens generated when it did (-1: not)
            "draft_first_at": s.draft_first_at,     # tokens generated when the draft first ran (-1: not)
            # the share of the prompt a windowed draft left unread as the generation ended (0:
            # it read all of it, or the prompt fit its head and window)
            "draft_unread": self.policy.draft_unread if self.draft is not None else 0.0,
            # the draft's acceptance as the policy reckoned it at the end (carried and seen
            # evidence, the target's certainty on this generation's tokens)
            "draft_expected": self.policy.draft_mean() if self.draft is not None else None,
            "t_draft_token_est": self.cost.t_draft(),
            "t_target_token_est": self.cost.t_verify(1) if self.st.n_passes else 0.0,
            "t_verify_est": self.cost.verify_times,
            "attn_time": self.cost.attn_time,
            "t_calibrate": s.t_calibrate_us * 1e-6,
            "n_one_token": s.n_one,
            "t_one_token": s.t_one_us * 1e-6 / s.n_one if s.n_one else None,
            "trace": self.trace,
        }


cdef inline bint _bytes_eq(const char * a, const char * b, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        if a[i] != b[i]:
            return False
    return True
