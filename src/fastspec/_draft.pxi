# The draft model as a proposer: a small model run one token at a time.  The one costly
# proposer: each token is a decode, so the policy decides token by token whether to
# draft on (Policy.draft_decision), and at sampling temperatures it supplies its
# distributions q (the exact speculative-sampling rule needs them).  Included into
# _core.pyx after _policy.pxi.

cdef enum:
    # an adaptive draft that has fallen further behind than this (a long new prompt, a
    # long pause) reads only the first DRAFT_HEAD tokens of the text (a chat template's
    # system prompt) and the last DRAFT_WINDOW of what it missed: its catch-up, and so
    # its first look at a new text, costs at most that much prefill
    DRAFT_WINDOW = 64
    DRAFT_HEAD = 32
    # greedy: a catch-up over tokens the target generated also tells how often the draft
    # would have proposed them (its prediction at each against the token that followed):
    # acceptance evidence on this very text for the price of their output rows, at most
    # this many
    LOOK_MAX = 32
    # the draft is not probed before an answer has this many tokens (see Generator._choose):
    # its opening is what a draft guesses worst, and the target's certainty on a few
    # formulaic tokens says little yet of the text (chat-2 was probed at 4 tokens on
    # those, at 0.57 acceptance)
    DRAFT_PROBE_AFTER = 8
    # greedy: a generated token whose last COPY_NGRAM tokens (itself included) occur in the
    # part of a long prompt a windowed draft does not read is a copy from there: the
    # target is sure of it because it read it, which tells nothing of a draft that did not
    # (extraction and summaries, edits: the draft was caught up on that certainty and then
    # drafted nothing; on other edits it copied about as well as the target).  The draft's
    # own tokens and looks there still count as evidence of it, but do not teach the table
    # by certainty either.  (Tried: copies as a certainty class of their own, prior 0.5 and
    # learned: the draft then never ran where it could not learn it; 1.047x vs 1.053x.)
    COPY_NGRAM = 4
    # a run of this many generated tokens copied from the part of the prompt a windowed
    # draft skipped (edits: the answer is the file with a change; the run bears short gaps,
    # COPY_GAP_MAX, and leaves out the copies lookup proposed: run_copy, copy_step) says the answer
    # goes on copying: what is left of the prompt after the last copy's source is then taken
    # as the tokens a reading of all of it can serve, where that is more (Generator._choose)
    COPY_RUN_MIN = 16
    # a run of copies survives this many generated tokens in a row that are no copy (an
    # edit's renamed name: the changed token and the 4-grams through it); more end it
    COPY_GAP_MAX = 8
    # a prompt longer than this is long: a windowed draft reads its head and last window
    # (the free proposers' share is kept apart for such prompts: Generator._long_prompt)
    LONG_PROMPT = DRAFT_HEAD + DRAFT_WINDOW

DRAFT_CATCHUP_WINDOW = DRAFT_WINDOW   # (for Python: tests, the docs)
LONG_PROMPT_TOKENS = LONG_PROMPT     # (for Python: tests)
COPY_RUN_MIN_TOKENS = COPY_RUN_MIN    # (for Python: tests)
COPY_GAP_MAX_TOKENS = COPY_GAP_MAX
DRAFT_CATCHUP_HEAD = DRAFT_HEAD       # (for Python: bench/draft_window.py)
DRAFT_PROBE_AFTER_TOKENS = DRAFT_PROBE_AFTER   # (for Python: tests)



cdef class DraftProposer(Proposer):
    """Drafts with a draft-model Context kept in step with the sequence.  While the
    policy sets it aside its KV cache falls behind; the next draft catches up with the
    tokens it missed in one batched decode."""
    cdef Context ctx
    cdef Policy policy
    cdef int n_vocab                      # the target's: rows of q_buf
    cdef int n_vocab_draft                # ids both models know
    cdef SamplingParams sp
    cdef bint greedy
    cdef uint64_t * rng                   # the generator's random state
    cdef float * q_buf                    # MAX_DRAFT distributions (sampling only)
    cdef ProbIdx * scratch
    cdef int n_draft_min
    cdef float p_min
    cdef bint adaptive
    cdef bint need_conf
    # set per pass by the loop
    cdef int probe_k                      # > 0: draft exactly this many (a probe), no early stop
    # results of the last propose()
    cdef double last_e                    # expected tokens of the pass, as drafted
    cdef double t_catchup                 # seconds of this draft's catch-up beyond one decode
    cdef int n_dropped                    # 1: it decoded a token it then dropped (a decode more)
    cdef int64_t n_decodes
    cdef int window                       # catch up with at most this many tokens (0: all)
    cdef int window_default               # what window is at each generation's start
    cdef const int8_t * tgap              # the generator's: the target's certainty bucket by position (or NULL)
    cdef int gen_start                    # sequence position of the first generated token
    cdef int64_t n_looked                 # tokens of evidence from catch-ups (this generation)
    # a draft context that computes logits for the leading ids only (Context.set_n_logits)
    # also gets them for the ids beyond seen in this sequence: the prompt's, then the
    # output's as they come (a name the code uses, a rare word the answer repeats)
    cdef int n_lead                       # the leading ids (>= n_vocab_draft: not trimmed)
    cdef ll.llama_token extra[MAX_EXTRA_LOGITS]
    cdef int n_extra
    cdef bint extra_dirty                 # extra[] gained ids the context does not have yet
    cdef int seen_len                     # sequence positions already looked at for them

    def __cinit__(self, Context ctx not None, Policy policy not None, int n_vocab, *, SamplingParams sp,
                  int n_draft_min=0, float p_min=0.0, bint adaptive=True):
        self.source = SRC_DRAFT
        self.costly = True
        self.ctx = ctx
        self.policy = policy
        self.n_vocab = n_vocab
        self.n_vocab_draft = min(n_vocab, ctx.model.n_vocab)
        self.n_lead = ctx.n_logits
        self.sp = sp
        self.greedy = sp.temperature == 0.0
        self.rng = NULL
        self.tgap = NULL
        self.n_draft_min = n_draft_min
        self.p_min = p_min
        self.adaptive = adaptive
        self.need_conf = adaptive or p_min > 0.0
        # (a model whose memory cannot drop part of a sequence reads all it missed)
        self.window = DRAFT_WINDOW if adaptive and ctx.can_trim else 0
        self.window_default = self.window
        self.q_buf = NULL
        self.scratch = NULL
        if not self.greedy:
            self.q_buf = <float *>malloc(<size_t>MAX_DRAFT * n_vocab * sizeof(float))
            self.scratch = <ProbIdx *>malloc(n_vocab * sizeof(ProbIdx))
            if self.q_buf == NULL or self.scratch == NULL:
                raise MemoryError()

    def __dealloc__(self):
        free(self.q_buf)
        free(self.scratch)

    cdef int begin(self, const ll.llama_token * seq, int n_prompt) except -1:
        self.n_decodes = 0
        self.probe_k = 0
        self.gen_start = n_prompt
        self.n_looked = 0
        self.n_extra = 0
        self.seen_len = 0
        self.extra_dirty = False
        if self.trimmed():
            for t in (ll.llama_vocab_eos(self.ctx.model.vocab), ll.llama_vocab_eot(self.ctx.model.vocab)):
                self._note_extra(t)
            self._note_seen(seq, n_prompt)
            self._sync_extra()
        return 0

    cdef hint(self, list ids):
        """Ids beyond the leading ones this generation is likely to use (words of the
        prompt in other forms, say): their logits from the draft's first token on."""
        for t in ids:
            # compared as Python ints: an id of any size is passed over, not an OverflowError
            if self.n_lead <= t < self.n_vocab_draft:
                self._note_extra(<ll.llama_token>(<long>t))
        self._sync_extra()

    cdef inline bint trimmed(self) noexcept nogil:
        """Whether the context computes logits for the leading ids only."""
        return self.n_lead < self.n_vocab_draft

    cdef inline void _note_extra(self, ll.llama_token t) noexcept nogil:
        cdef int i
        if t < self.n_lead or t >= self.n_vocab_draft or self.n_extra >= MAX_EXTRA_LOGITS:
            return
        for i in range(self.n_extra):
            if self.extra[i] == t:
                return
        self.extra[self.n_extra] = t
        self.n_extra += 1
        self.extra_dirty = True

    cdef inline void _note_seen(self, const ll.llama_token * seq, int seq_len) noexcept nogil:
        cdef int i
        for i in range(self.seen_len, seq_len):
            if seq[i] >= self.n_lead:
                self._note_extra(seq[i])
        if seq_len > self.seen_len:
            self.seen_len = seq_len

    cdef inline void _sync_extra(self) noexcept nogil:
        # a failure here (no memory for the rows) leaves the context as it was: fewer ids
        if self.extra_dirty:
            self.ctx._set_n_logits(self.n_lead, self.extra, self.n_extra)
            self.extra_dirty = False

    cdef inline int _greedy_best(self, const float * logits, float * conf) noexcept nogil:
        """The most likely token and (when the policy needs it) its probability, reading
        only the logits the context computes."""
        cdef int n = self.n_lead if self.trimmed() else self.n_vocab_draft
        cdef int i, t, best = argmax(logits, n)
        cdef float m = logits[best]
        cdef double s = 0.0
        for i in range(self.n_extra):
            t = self.extra[i]
            if logits[t] > m:
                m = logits[t]
                best = t
        conf[0] = 1.0
        if self.need_conf:
            s = exp_sum(logits, n, m)
            for i in range(self.n_extra):
                t = self.extra[i]
                if logits[t] > m - EXP_FLOOR:
                    s += expf(logits[t] - m)
            conf[0] = <float>(1.0 / s)
        return best

    cdef void extend(self, const ll.llama_token * seq, int seq_len) noexcept nogil:
        # keep only what the sequence kept (drafts past a rejection leave the cache)
        if self.ctx.n_past > seq_len - 1:
            self.ctx._remove_from(seq_len - 1)
        if self.trimmed():
            self._note_seen(seq, seq_len)

    cdef inline int unread_len(self, int seq_len) noexcept nogil:
        """Tokens a catch-up that reads everything it has not decoded would decode (a
        stretch it skipped included)."""
        return seq_len - (self.ctx.skip_at if self.ctx.n_skip > 0 else self.ctx.n_past)

    cdef inline double unread_share(self, int seq_len, int n_prompt) noexcept nogil:
        """The share of the prompt's n_prompt tokens this draft leaves unread: the stretch
        it skipped, and what its catch-up from here would skip."""
        cdef int lo, hi, n_behind = seq_len - self.ctx.n_past
        if n_prompt <= 0:
            return 0.0
        if self.ctx.n_skip > 0:
            lo = self.ctx.skip_at
            hi = lo + self.ctx.n_skip
        else:
            lo = self.ctx.n_past if self.ctx.n_past > DRAFT_HEAD else DRAFT_HEAD
            hi = lo
        if self.catchup_len(n_behind) < n_behind:
            hi = seq_len - self.window
        if hi > n_prompt:
            hi = n_prompt
        return (hi - lo) / <double>n_prompt if hi > lo else 0.0

    cdef void read_all(self) noexcept nogil:
        """From now on (this generation) catch up with everything, the stretch of the
        prompt skipped before included: the answer copies from it."""
        self.window = 0
        if self.ctx.n_skip > 0:
            self.ctx._remove_from(self.ctx.skip_at)

    cdef inline int catchup_len(self, int n_behind) noexcept nogil:
        """Tokens a catch-up from n_behind tokens behind decodes."""
        cdef int head = DRAFT_HEAD - self.ctx.n_past if self.ctx.n_skip == 0 else 0
        if head < 0:
            head = 0
        if self.window <= 0 or n_behind <= self.window + head:
            return n_behind
        return self.window + head

    cdef inline int look_len(self, int seq_len, int n_behind) noexcept nogil:
        """Tokens of evidence a catch-up from n_behind tokens behind gives (greedy):
        generated tokens it reads whose successor is known."""
        cdef int n = (n_behind if n_behind < self.window else self.window) - 1   # the window's tokens
        cdef int gen = seq_len - self.gen_start
        if not self.greedy or not self.adaptive:
            return 0
        if n > gen:
            n = gen
        if n > LOOK_MAX:
            n = LOOK_MAX
        return n if n > 0 else 0

    cdef int propose(self, const ll.llama_token * seq, int seq_len, int cap,
                     ll.llama_token * out, float * conf, int * key) noexcept nogil:
        """Draft up to ``cap`` tokens.  Returns how many, or -1 if a decode failed."""
        cdef int rc, i, j, tok, n_new, decision, n_look, p0, n_head
        cdef float c
        cdef float * logits
        cdef float * q
        cdef int64_t t0
        cdef double p_all = 1.0
        key[0] = 0
        self.last_e = 1.0
        self.t_catchup = 0.0
        self.n_dropped = 0
        self._sync_extra()
        # catch up with the tokens the draft has not seen (the pending one, maybe more; of a
        # long stretch only the last ``window``)
        n_new = seq_len - self.ctx.n_past
        if n_new < 1:
            self.ctx._remove_from(seq_len - 1)
            n_new = seq_len - self.ctx.n_past
        t0 = ll.llama_time_us()
        n_head = 0
        if self.catchup_len(n_new) < n_new:
            if self.ctx.n_skip == 0 and self.ctx.n_past < DRAFT_HEAD:
                n_head = DRAFT_HEAD - self.ctx.n_past
                rc = self.ctx._decode(seq + self.ctx.n_past, n_head, n_head)
                if rc != 0:
                    return -1
            self.ctx._skip_to(seq_len - self.window)
            n_new = seq_len - self.ctx.n_past
        n_look = self.look_len(seq_len, n_new) if n_new <= self.ctx.n_batch else 0
        p0 = self.ctx.n_past
        rc = self.ctx._decode(seq + p0, n_new, n_new - 1 - n_look)
        if rc != 0:
            return -1
        if n_look > 0:
            # what the draft would have proposed at each of the last n_look generated
            # tokens: evidence of its acceptance on this text
            for j in range(n_look):
                i = p0 + n_new - n_look + j
                tok = self._greedy_best(self.ctx._logits(j), &c)
                self.policy.observe_look(c, tok == seq[i], self.tgap[i] if self.tgap != NULL else -1)
            self.n_looked += n_look
            if self.probe_k > 0:
                self.probe_k = 0        # a probe's question is answered: draft on as the evidence says
        n_new += n_head                 # tokens decoded in all (the costs' view)
        if n_new == 1:
            self.policy.cost.observe_draft((ll.llama_time_us() - t0) * 1e-6)
        else:
            self.policy.cost.observe_catchup(n_new, (ll.llama_time_us() - t0) * 1e-6)
            if n_new > CATCHUP_SMALL:
                # a one-off cost of having paused, not of drafting
                self.t_catchup = (ll.llama_time_us() - t0) * 1e-6 - self.policy.cost.t_draft()
        self.n_decodes += 1
        for j in range(cap):
            if self.ctx.n_past >= self.ctx.n_ctx:
                return j
            logits = self.ctx._logits(n_look if j == 0 else 0)
            if self.greedy:
                tok = self._greedy_best(logits, &c)
            else:
                q = self.q_buf + <size_t>j * self.n_vocab
                c = shape_probs(logits, self.n_vocab_draft, &self.sp, q, self.scratch)   # (its largest)
                if self.n_vocab_draft < self.n_vocab:
                    memset(q + self.n_vocab_draft, 0, (self.n_vocab - self.n_vocab_draft) * sizeof(float))
                tok = sample_dense(q, self.n_vocab_draft, self.rng)
            if self.probe_k == 0 and j >= self.n_draft_min:
                if self.p_min > 0.0 and c < self.p_min:
                    return j
                if self.adaptive:
                    decision = self.policy.draft_decision(j, cap, c, (j + 1) * self.policy.td,
                                                          &p_all, &self.last_e)
                    if decision == 0:
                        self.last_e -= p_all       # dropped: not part of the pass
                        self.n_dropped = 1
                        return j
                    out[j] = tok
                    conf[j] = c
                    if decision == 1:
                        return j + 1
                else:
                    p_all *= self.policy.draft_chance(c)
                    self.last_e += p_all
            else:
                # below n_draft_min, or a probe (exactly probe_k tokens, whatever their confidence)
                p_all *= self.policy.draft_chance(c)
                self.last_e += p_all
            out[j] = tok
            conf[j] = c
            if (ll.llama_vocab_is_eog(self.ctx.model.vocab, tok) or j + 1 == cap
                    or (self.probe_k > 0 and j + 1 >= self.probe_k)):
                return j + 1
            t0 = ll.llama_time_us()
            rc = self.ctx._decode(&out[j], 1, 0)
            if rc != 0:
                return -1
            self.policy.cost.observe_draft((ll.llama_time_us() - t0) * 1e-6)
            self.n_decodes += 1
        return cap

    cdef inline float * q_row(self, int j) noexcept nogil:
        return self.q_buf + <size_t>j * self.n_vocab
