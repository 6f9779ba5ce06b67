# The generation loop: target alone, or speculative with a draft model and/or n-gram
# lookup.  Included into _core.pyx.  One call of Generator._step() is one target pass:
# propose up to k tokens, verify them in one batched decode, emit the accepted prefix
# plus one token of the target's own, and trim both KV caches to what was kept.

cdef enum:
    N_BUCKETS = 10

cdef enum Finish:
    RUNNING = 0
    FIN_EOG = 1
    FIN_STOP = 2
    FIN_MAX_TOKENS = 3
    FIN_CONTEXT = 4
    FIN_ERROR = 5

FINISH_REASONS = {0: None, 1: "stop", 2: "stop", 3: "length", 4: "length", 5: "error"}

cdef struct Stats:
    int64_t n_drafted
    int64_t n_accepted
    int64_t n_rejected
    int64_t n_passes
    int64_t n_generated
    int64_t n_eog                     # 1 if an end-of-generation token ended the run
    int64_t drafted_by_pos[MAX_DRAFT]
    int64_t accepted_by_pos[MAX_DRAFT]
    int64_t drafted_by_src[3]
    int64_t accepted_by_src[3]
    int64_t emitted_by_src[3]
    int64_t t_prefill_us
    int64_t t_draft_us
    int64_t t_verify_us
    int64_t t_total_us
    int64_t n_draft_decodes
    int64_t t_calibrate_us


cdef class CostModel:
    """Measured costs of one target/draft pair on this machine: seconds per one-token
    draft decode and per target decode of n tokens (n = 1..MAX_DRAFT+1).  A decoder
    keeps one across generations so that what was measured is not measured again."""
    cdef double t_draft_est
    cdef double t_verify_est[MAX_DRAFT + 2]
    cdef int n_verify_obs[MAX_DRAFT + 2]
    cdef public bint calibrated

    def __cinit__(self):
        self.reset()

    def reset(self):
        """Forget every measurement."""
        self.t_draft_est = 0.0
        for i in range(MAX_DRAFT + 2):
            self.t_verify_est[i] = 0.0
            self.n_verify_obs[i] = 0
        self.calibrated = False

    @property
    def draft_time(self):
        """Seconds per one-token draft decode (0.0 until measured)."""
        return self.t_draft_est

    @property
    def verify_times(self):
        """{n: seconds} for the target decode sizes measured so far."""
        return {n: self.t_verify_est[n] for n in range(1, MAX_DRAFT + 2) if self.n_verify_obs[n] > 0}

    cdef inline void observe_draft(self, double secs) noexcept nogil:
        if self.t_draft_est == 0.0:
            self.t_draft_est = secs
        else:
            self.t_draft_est += 0.1 * (secs - self.t_draft_est)

    cdef inline void observe_verify(self, int n, double secs) noexcept nogil:
        if self.n_verify_obs[n] == 0:
            self.t_verify_est[n] = secs
        else:
            self.t_verify_est[n] += 0.2 * (secs - self.t_verify_est[n])
        self.n_verify_obs[n] += 1

    cdef double t_verify(self, int n) noexcept nogil:
        """Estimated time of a target decode of n tokens: the measured figure where there
        is one, else interpolated between measured sizes, else a prior that grows by 20%
        of a single-token pass per extra token (what a CPU shows)."""
        cdef int lo = n, hi = n
        if self.n_verify_obs[n] > 0:
            return self.t_verify_est[n]
        while lo > 0 and self.n_verify_obs[lo] == 0:
            lo -= 1
        while hi < MAX_DRAFT + 1 and self.n_verify_obs[hi] == 0:
            hi += 1
        if lo > 0 and hi <= MAX_DRAFT + 1 and self.n_verify_obs[hi] > 0:
            return self.t_verify_est[lo] + (self.t_verify_est[hi] - self.t_verify_est[lo]) * (n - lo) / (hi - lo)
        if lo > 0:
            return self.t_verify_est[lo] * (1.0 + 0.2 * (n - 1)) / (1.0 + 0.2 * (lo - 1))
        if hi <= MAX_DRAFT + 1 and self.n_verify_obs[hi] > 0:
            return self.t_verify_est[hi] * (1.0 + 0.2 * (n - 1)) / (1.0 + 0.2 * (hi - 1))
        return 2.5 * self.t_draft_est * (1.0 + 0.2 * (n - 1))


cdef class Generator:
    """One generation at a time on a target Context and, optionally, a draft Context."""
    cdef Context tgt
    cdef Context drf
    cdef readonly int n_vocab
    cdef int n_vocab_draft
    cdef SamplingParams sp
    cdef bint greedy
    cdef uint64_t rng
    cdef uint64_t seed
    # settings
    cdef int n_draft_max
    cdef int n_draft_min
    cdef float p_min
    cdef bint adaptive
    cdef int max_tokens
    cdef bint lookup
    cdef int max_verify               # largest verification batch allowed (0 = any)
    cdef bint biased_rule             # tests only: a wrong acceptance rule
    cdef NgramIndex ngram
    cdef double lookup_hits[NGRAM_MAX_LEVELS + 1]   # by matched n-gram length
    cdef double lookup_tries[NGRAM_MAX_LEVELS + 1]
    cdef int lookup_n                                # n of this step's lookup match
    cdef double lookup_rate                          # expected tokens/s of this step's lookup proposal
    cdef double draft_rate                           # tokens/s of recent draft-model steps (EMA)
    cdef int n_draft_steps                           # steps that ran the draft model
    cdef int skip_left                               # steps left without the draft model
    cdef int skip_period                             # current length of such a pause
    cdef double t_catchup_extra                      # this step: catch-up time beyond one decode
    # the sequence: prompt then generated tokens; the last one is "pending" (not yet in
    # the target's KV cache)
    cdef ll.llama_token * seq
    cdef int8_t * src
    cdef int seq_len
    cdef int seq_cap
    cdef int n_prompt
    # this step's proposal
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
    cdef float * q_buf                # MAX_DRAFT draft distributions (sampling only)
    cdef float * p_buf
    cdef ProbIdx * scratch
    # cost model for the adaptive draft length: timings (kept across generations when
    # the caller passes the same CostModel) and acceptance by confidence (per generation)
    cdef CostModel cost
    cdef double bucket_hits[N_BUCKETS]
    cdef double bucket_tries[N_BUCKETS]
    cdef double hits_all
    cdef double tries_all
    # state
    cdef Stats st
    cdef public int finish
    cdef bint started

    def __cinit__(self, Context target not None, Context draft=None, *, double temperature=0.0,
                  int top_k=0, double top_p=1.0, double min_p=0.0, seed=None, int n_draft=8,
                  int n_draft_min=0, double p_min=0.0, bint adaptive=True, int max_tokens=256,
                  stop=(), bint lookup=False, int ngram_max=4, int ngram_min=1, int max_verify=0,
                  CostModel cost=None, bint _biased_rule_for_tests=False):
        target._check()
        if draft is not None:
            draft._check()
        self.tgt = target
        self.drf = draft
        self.n_vocab = target.model.n_vocab
        # draft-side distributions cover the ids both models know (sizes may differ a little)
        self.n_vocab_draft = min(self.n_vocab, draft.model.n_vocab) if draft is not None else 0
        self.sp.temperature = temperature
        self.sp.top_k = top_k
        self.sp.top_p = top_p
        self.sp.min_p = min_p
        self.greedy = temperature == 0.0
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        self.seed = <uint64_t>(seed & 0xFFFFFFFFFFFFFFFF)
        self.rng = self.seed
        if n_draft > MAX_DRAFT:
            raise ValueError(f"n_draft must be at most {MAX_DRAFT}, got {n_draft}")
        self.n_draft_max = n_draft
        self.n_draft_min = n_draft_min
        self.p_min = p_min
        self.adaptive = adaptive
        self.max_tokens = max_tokens
        self.lookup = lookup
        self.max_verify = max_verify
        self.biased_rule = _biased_rule_for_tests
        self.cost = cost if cost is not None else CostModel()
        if lookup:
            if not (1 <= ngram_min <= ngram_max <= NGRAM_MAX_LEVELS):
                raise ValueError(f"need 1 <= ngram_min <= ngram_max <= {NGRAM_MAX_LEVELS}")
            if ngram_init(&self.ngram, target.n_ctx + 1, ngram_min, ngram_max) != 0:
                raise MemoryError()
        self._stops = [s for s in stop if len(s) > 0]
        self.n_stops = len(self._stops)
        self.stop_ptr = <char **>calloc(max(self.n_stops, 1), sizeof(char *))
        self.stop_len = <int *>calloc(max(self.n_stops, 1), sizeof(int))
        self.max_stop_len = 0
        for i, s in enumerate(self._stops):
            self.stop_ptr[i] = <char *>(<bytes>s)
            self.stop_len[i] = len(s)
            self.max_stop_len = max(self.max_stop_len, len(s))
        self.seq_cap = target.n_ctx + 1
        self.seq = <ll.llama_token *>malloc(self.seq_cap * sizeof(ll.llama_token))
        self.src = <int8_t *>malloc(self.seq_cap * sizeof(int8_t))
        self.text_cap = 4096
        self.text = <char *>malloc(self.text_cap)
        self.p_buf = <float *>malloc(self.n_vocab * sizeof(float))
        self.scratch = <ProbIdx *>malloc(self.n_vocab * sizeof(ProbIdx))
        self.q_buf = NULL
        if not self.greedy and draft is not None:
            self.q_buf = <float *>malloc(<size_t>MAX_DRAFT * self.n_vocab * sizeof(float))
        if (self.seq == NULL or self.src == NULL or self.text == NULL or self.p_buf == NULL
                or self.scratch == NULL or (not self.greedy and draft is not None and self.q_buf == NULL)):
            raise MemoryError()
        self._reset_cost_model()
        self.started = False
        self.finish = RUNNING

    def __dealloc__(self):
        free(self.seq)
        free(self.src)
        free(self.text)
        free(self.p_buf)
        free(self.scratch)
        free(self.q_buf)
        free(self.stop_ptr)
        free(self.stop_len)
        ngram_free(&self.ngram)

    cdef void _reset_cost_model(self) noexcept:
        self.draft_rate = 0.0
        self.lookup_rate = 0.0
        self.n_draft_steps = 0
        self.skip_left = 0
        self.skip_period = 1
        self.t_catchup_extra = 0.0
        for i in range(N_BUCKETS):
            self.bucket_hits[i] = 0.0
            self.bucket_tries[i] = 0.0
        self.hits_all = 0.0
        self.tries_all = 0.0
        for i in range(NGRAM_MAX_LEVELS + 1):
            self.lookup_hits[i] = 0.0
            self.lookup_tries[i] = 0.0

    # ------------------------------------------------------------------ setup
    def start(self, prompt_tokens):
        """Clear both KV caches and prefill them with the prompt (all but its last token,
        which the first step decodes)."""
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
        self.seq_len = n
        self.n_prompt = n
        if self.lookup:
            ngram_clear(&self.ngram)
            for i in range(1, n):
                ngram_add(&self.ngram, self.seq, i)
        self.text_len = 0
        self.text_end = 0
        self.rng = self.seed
        memset(&self.st, 0, sizeof(Stats))
        self.finish = RUNNING
        self.started = True
        cdef int64_t t0 = ll.llama_time_us()
        self.tgt.clear()
        self._prefill(self.tgt, n - 1)
        if self.drf is not None:
            self.drf.clear()
            self._prefill(self.drf, n - 1)
        self.st.t_prefill_us = ll.llama_time_us() - t0

    cdef _prefill(self, Context c, int n):
        """Decode seq[0:n] into ``c`` in n_batch chunks, checking for Ctrl-C between them."""
        cdef int done = 0, m, rc
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
        """Time one target decode of each batch size the adaptive mode may verify (1 up to
        ``max_n``, default n_draft + 1: every size to 9, then 12, 13, 16, 17, ...; sizes in
        between are interpolated) into the cost model, and mark it calibrated.  Call after
        start(); the KV cache is left as it was.  Without it, sizes are learned as used,
        which never reveals that, on a CPU, a batch of 4 can cost less than one of 3."""
        self._check_started()
        if max_n <= 0:
            max_n = min(self.n_draft_max, MAX_DRAFT) + 1
        cdef int pending_pos = self.seq_len - 1
        cdef int n, j, rc = 0
        cdef int64_t t0, t1
        cdef int64_t c0 = ll.llama_time_us()
        sizes = [n for n in range(1, max_n + 1) if n <= 9 or n % 4 in (0, 1)]
        for i, n in enumerate([1] + sizes):      # the first decode warms caches: not kept
            if n > min(self.tgt.n_ctx - pending_pos, MAX_DRAFT + 1):
                break
            for j in range(n):              # any tokens time the same: the pending one, repeated
                self._vbatch[j] = self.seq[pending_pos]
            with nogil:
                t0 = ll.llama_time_us()
                rc = self.tgt._decode(self._vbatch, n, 0)
                t1 = ll.llama_time_us()
                self.tgt._remove_from(pending_pos)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc} while calibrating")
            if i > 0:
                self.cost.observe_verify(n, (t1 - t0) * 1e-6)
            PyErr_CheckSignals()
        self.cost.calibrated = True
        self.st.t_calibrate_us += ll.llama_time_us() - c0

    # ------------------------------------------------------------------ running
    def run(self):
        """Generate until a finish condition.  Ctrl-C stops between two target passes."""
        self._check_started()
        while self.finish == RUNNING:
            with nogil:
                self._step()
            PyErr_CheckSignals()
        return FINISH_REASONS[self.finish]

    def step(self):
        """One target pass; returns (tokens, sources) emitted by it ([] once finished)."""
        self._check_started()
        if self.finish != RUNNING:
            return [], []
        cdef int before = self.seq_len
        with nogil:
            self._step()
        cdef int n = self.n_emitted_last
        return ([self.seq[i] for i in range(before, before + n)],
                [self.src[i] for i in range(before, before + n)])

    def _check_started(self):
        if not self.started:
            raise RuntimeError("call start(prompt_tokens) first")
        self.tgt._check()
        if self.drf is not None:
            self.drf._check()

    cdef void _step(self) noexcept nogil:
        cdef int64_t t0 = ll.llama_time_us(), t1, t2
        cdef int pending_pos = self.seq_len - 1
        cdef int room = self.tgt.n_ctx - pending_pos        # tokens the target can still take
        cdef int remaining = self.max_tokens - self.st.n_generated
        self.n_emitted_last = 0
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
        cdef int k = 0
        cdef bint drafted = False
        cdef bint use_draft = self.drf is not None and cap > 0 and self._draft_pays()
        if self.lookup and cap > 0:
            k = self._lookup(cap)
            # combined mode: a free lookup proposal still costs its verification; prefer
            # the draft model when its steps have given more tokens per second (but try
            # each match length a few times first)
            if (k > 0 and use_draft and self.adaptive and self.lookup_tries[self.lookup_n] >= 4.0
                    and self.lookup_rate < self.draft_rate):
                k = 0
        if k == 0 and use_draft:
            self.t_catchup_extra = 0.0
            k = self._draft(cap)
            drafted = True
            if k < 0:
                self.finish = FIN_ERROR
                return
        t1 = ll.llama_time_us()
        # verification batch: pending token + k drafted tokens, logits at every position
        self.dtok_batch_prepare(k)
        cdef int rc = self.tgt._decode(self._vbatch, k + 1, 0)
        if rc != 0:
            self.finish = FIN_ERROR
            return
        t2 = ll.llama_time_us()
        self.cost.observe_verify(k + 1, (t2 - t1) * 1e-6)
        cdef int a = self._accept(k)
        # trim caches to what was kept: pending + a accepted drafts
        self.tgt._remove_from(pending_pos + a + 1)
        if self.drf is not None:
            self.drf._remove_from(pending_pos + a + 1)
        t2 = ll.llama_time_us()
        self.st.t_draft_us += t1 - t0
        self.st.t_verify_us += t2 - t1
        self.st.t_total_us += t2 - t0
        self.st.n_passes += 1
        if drafted:
            self._observe_draft_step(self.n_emitted_last, (t2 - t0) * 1e-6 - self.t_catchup_extra)

    cdef inline void dtok_batch_prepare(self, int k) noexcept nogil:
        cdef int j
        self._vbatch[0] = self.seq[self.seq_len - 1]
        for j in range(k):
            self._vbatch[j + 1] = self.dtok[j]

    # ------------------------------------------------------------------ draft or not
    cdef bint _draft_pays(self) noexcept nogil:
        """Adaptive mode: run the draft model this step?  Yes while its steps have given
        more tokens per second than the target alone (one token per single-token pass).
        When they have not, pause it, and try it again after 2, 4, 8 ... 64 steps (text
        changes: a code block in a chat reply).  The draft's KV cache catches up with
        the tokens it missed in one batched decode when it resumes."""
        if not self.adaptive or self.n_draft_steps < 4:
            return True
        if self.draft_rate * self.cost.t_verify(1) >= 1.0:
            self.skip_period = 1
            self.skip_left = 0
            return True
        if self.skip_left > 0:
            self.skip_left -= 1
            return False
        if self.skip_period < 64:
            self.skip_period *= 2
        self.skip_left = self.skip_period
        return True

    cdef inline void _observe_draft_step(self, int n_emitted, double secs) noexcept nogil:
        if secs <= 0.0:
            return
        if self.n_draft_steps == 0:
            self.draft_rate = n_emitted / secs
        else:
            self.draft_rate += 0.3 * (n_emitted / secs - self.draft_rate)
        self.n_draft_steps += 1

    # ------------------------------------------------------------------ drafting
    cdef int _draft(self, int cap) noexcept nogil:
        """Propose up to ``cap`` tokens with the draft model.  Returns how many (or -1)."""
        cdef int rc, j, tok, n_new
        cdef float conf
        cdef float * logits
        cdef float * q
        cdef int64_t t0
        cdef double p_all = 1.0, e_sum = 1.0
        # catch up with tokens the draft has not seen (the pending token, maybe one more)
        n_new = self.seq_len - self.drf.n_past
        if n_new < 1:
            self.drf._remove_from(self.seq_len - 1)
            n_new = self.seq_len - self.drf.n_past
        t0 = ll.llama_time_us()
        rc = self.drf._decode(self.seq + self.drf.n_past, n_new, n_new - 1)
        if rc != 0:
            return -1
        if n_new == 1:
            self.cost.observe_draft((ll.llama_time_us() - t0) * 1e-6)
        elif n_new > 2:
            # the draft is catching up after a pause: a one-off cost of pausing, not of drafting
            self.t_catchup_extra = (ll.llama_time_us() - t0) * 1e-6 - self.cost.t_draft_est
            if self.t_catchup_extra < 0.0:
                self.t_catchup_extra = 0.0
        for j in range(cap):
            if self.drf.n_past >= self.drf.n_ctx:
                return j
            logits = self.drf._logits(0)
            if self.greedy:
                tok = argmax(logits, self.n_vocab_draft)
                conf = top_prob(logits, self.n_vocab_draft) if (self.adaptive or self.p_min > 0.0) else 1.0
            else:
                q = self.q_buf + <size_t>j * self.n_vocab
                shape_probs(logits, self.n_vocab_draft, &self.sp, q, self.scratch)
                if self.n_vocab_draft < self.n_vocab:
                    memset(q + self.n_vocab_draft, 0, (self.n_vocab - self.n_vocab_draft) * sizeof(float))
                tok = sample_dense(q, self.n_vocab_draft, &self.rng)
                conf = q[argmax(q, self.n_vocab_draft)]
            if j >= self.n_draft_min:
                if self.p_min > 0.0 and conf < self.p_min:
                    return j
                if self.adaptive:
                    rc = self._adaptive_decision(j, cap, conf, &p_all, &e_sum)
                    if rc == 0:
                        return j          # drop this token, stop
                    if rc == 1:
                        self._take_draft(j, tok, conf)
                        return j + 1      # keep it, stop
            self._take_draft(j, tok, conf)
            if ll.llama_vocab_is_eog(self.drf.model.vocab, tok) or j + 1 == cap:
                return j + 1
            t0 = ll.llama_time_us()
            rc = self.drf._decode(&self.dtok[j], 1, 0)
            if rc != 0:
                return -1
            self.cost.observe_draft((ll.llama_time_us() - t0) * 1e-6)
            self.st.n_draft_decodes += 1
        return cap

    cdef int _lookup(self, int cap) noexcept nogil:
        """Propose the tokens that followed the latest earlier occurrence of the longest
        matching suffix (n-gram) of the sequence.  Returns how many (0 if none)."""
        cdef int n_match = 0
        cdef int start = ngram_find(&self.ngram, self.seq, self.seq_len, &n_match)
        cdef int avail, k, j, best_k
        cdef double a, e, p, r, best_r
        if start < 0:
            return 0
        avail = self.seq_len - start
        if avail > cap:
            avail = cap
        k = avail
        if self.adaptive:
            # proposals are free; choose how many to verify from the acceptance seen so
            # far for matches of this length (prior: 1/2)
            a = (self.lookup_hits[n_match] + 1.0) / (self.lookup_tries[n_match] + 2.0)
            e = 1.0
            p = 1.0
            best_r = 1.0 / self.cost.t_verify(1)
            best_k = 0
            for j in range(1, avail + 1):
                p *= a
                e += p
                r = e / self.cost.t_verify(j + 1)
                if r > best_r:
                    best_r = r
                    best_k = j
            k = best_k
            self.lookup_rate = best_r
            if k < self.n_draft_min and self.n_draft_min <= avail:
                k = self.n_draft_min
        self.lookup_n = n_match
        for j in range(k):
            self.dtok[j] = self.seq[start + j]
            self.dsrc[j] = SRC_LOOKUP
            self.dconf[j] = -1.0
        return k

    cdef inline void _take_draft(self, int j, int tok, float conf) noexcept nogil:
        self.dtok[j] = tok
        self.dsrc[j] = SRC_DRAFT
        self.dconf[j] = conf

    # ------------------------------------------------------------------ verifying
    cdef int _accept(self, int k) noexcept nogil:
        """Compare the k drafted tokens with the target's logits in the last decode, emit
        the accepted prefix and one target token.  Returns the number accepted."""
        cdef int j, a = 0, t = -1, d, i
        cdef float * logits
        cdef float * q
        cdef float pd, qd
        cdef bint ok
        for j in range(k):
            logits = self.tgt._logits(j)
            d = self.dtok[j]
            if self.greedy:
                t = argmax(logits, self.n_vocab)
                ok = t == d
            else:
                shape_probs(logits, self.n_vocab, &self.sp, self.p_buf, self.scratch)
                pd = self.p_buf[d]
                if self.dsrc[j] == SRC_DRAFT:
                    q = self.q_buf + <size_t>j * self.n_vocab
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
            self._observe_accept(j, ok)
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
                t = argmax(logits, self.n_vocab)
            else:
                shape_probs(logits, self.n_vocab, &self.sp, self.p_buf, self.scratch)
                t = sample_dense(self.p_buf, self.n_vocab, &self.rng)
        for j in range(a):
            if not self._emit(self.dtok[j], self.dsrc[j]):
                return a
        self._emit(t, SRC_TARGET)
        return a

    cdef bint _emit(self, int tok, int source) noexcept nogil:
        """Append one token; returns False once generation has finished."""
        if self.finish != RUNNING:
            return False
        if ll.llama_vocab_is_eog(self.tgt.model.vocab, tok):
            self.finish = FIN_EOG
            self.st.n_eog = 1
            return False
        self.seq[self.seq_len] = tok
        self.src[self.seq_len] = source
        self.seq_len += 1
        if self.lookup:
            ngram_add(&self.ngram, self.seq, self.seq_len - 1)
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

    # ------------------------------------------------------------------ cost model
    cdef inline void _observe_accept(self, int j, bint ok) noexcept nogil:
        cdef int b
        if self.dsrc[j] == SRC_LOOKUP:
            self.lookup_tries[self.lookup_n] += 1.0
            if ok:
                self.lookup_hits[self.lookup_n] += 1.0
            return
        b = <int>(self.dconf[j] * N_BUCKETS)
        if b >= N_BUCKETS:
            b = N_BUCKETS - 1
        if b < 0:
            b = 0
        self.bucket_tries[b] += 1.0
        self.tries_all += 1.0
        if ok:
            self.bucket_hits[b] += 1.0
            self.hits_all += 1.0

    cdef double _acc_given_conf(self, float conf) noexcept nogil:
        """Estimated chance that a drafted token of this confidence is accepted:
        the draft's own confidence as a prior, corrected by what was seen."""
        cdef int b = <int>(conf * N_BUCKETS)
        if b >= N_BUCKETS:
            b = N_BUCKETS - 1
        if b < 0:
            b = 0
        return (self.bucket_hits[b] + 2.0 * conf) / (self.bucket_tries[b] + 2.0)

    cdef int _adaptive_decision(self, int j, int cap, float conf, double * p_all, double * e_sum) noexcept nogil:
        """Drafted token j (0-based) has confidence ``conf``.  Decide with the cost model:
        0 = drop it and stop, 1 = keep it and stop, 2 = keep it and draft on.

        Expected output of a pass that verifies k drafts is E(k) = 1 + sum of the
        chances that drafts 1..i are all accepted; its time is the draft decodes plus
        the verification of k+1 tokens.  The chance for token j comes from its
        confidence (calibrated by what was seen); tokens not drafted yet are assumed
        as likely as this one (the draft's confidence runs in streaks)."""
        cdef double td = self.cost.t_draft_est
        cdef double acc = self._acc_given_conf(conf)
        cdef double p_j = p_all[0] * acc
        cdef double spent = (j + 1) * td                          # catch-up + draft decodes so far
        cdef double r_drop = e_sum[0] / (spent + self.cost.t_verify(j + 1))
        cdef double r_keep = (e_sum[0] + p_j) / (spent + self.cost.t_verify(j + 2))
        cdef double r_more = 0.0, e = e_sum[0] + p_j, p = p_j, r
        cdef int m
        for m in range(1, cap - j):
            p *= acc
            e += p
            r = e / (spent + m * td + self.cost.t_verify(j + 2 + m))
            if r > r_more:
                r_more = r
        p_all[0] = p_j
        e_sum[0] = e_sum[0] + p_j
        if r_drop >= r_keep and r_drop >= r_more:
            return 0
        if r_keep >= r_more:
            return 1
        return 2

    # ------------------------------------------------------------------ results
    @property
    def tokens(self):
        """Generated tokens so far (end-of-generation token excluded)."""
        return [self.seq[i] for i in range(self.n_prompt, self.seq_len)]

    @property
    def sources(self):
        """For each generated token: 0 target, 1 draft model, 2 n-gram lookup."""
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

    def stats(self):
        cdef Stats s = self.st
        k = min(self.n_draft_max, MAX_DRAFT)
        return {
            "n_generated": s.n_generated,
            "n_eog": s.n_eog,
            "n_drafted": s.n_drafted,
            "n_accepted": s.n_accepted,
            "n_rejected": s.n_rejected,
            "n_passes": s.n_passes,
            "drafted_by_pos": [s.drafted_by_pos[i] for i in range(k)],
            "accepted_by_pos": [s.accepted_by_pos[i] for i in range(k)],
            "drafted_by_source": {"draft": s.drafted_by_src[1], "lookup": s.drafted_by_src[2]},
            "accepted_by_source": {"draft": s.accepted_by_src[1], "lookup": s.accepted_by_src[2]},
            "emitted_by_source": {"target": s.emitted_by_src[0], "draft": s.emitted_by_src[1],
                                  "lookup": s.emitted_by_src[2]},
            "t_prefill": s.t_prefill_us * 1e-6,
            "t_draft": s.t_draft_us * 1e-6,
            "t_verify": s.t_verify_us * 1e-6,
            "t_generate": s.t_total_us * 1e-6,
            "n_draft_decodes": s.n_draft_decodes,
            "n_draft_steps": self.n_draft_steps,
            "t_draft_token_est": self.cost.t_draft_est,
            "t_target_token_est": self.cost.t_verify(1) if self.st.n_passes else 0.0,
            "t_verify_est": self.cost.verify_times,
            "t_calibrate": s.t_calibrate_us * 1e-6,
        }


cdef inline bint _bytes_eq(const char * a, const char * b, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        if a[i] != b[i]:
            return False
    return True
