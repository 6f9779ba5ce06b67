# The speculation policy: what the measured costs and the acceptance seen so far say to
# do in each target pass.  Included into _core.pyx after _proposer.pxi.
#
# A pass that verifies k proposed tokens, each accepted (given the ones before it were)
# with chance a_j, emits on average E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j tokens; it
# takes the proposer's time (draft model: k one-token decodes plus catching up with
# tokens it has not seen; free proposers: nothing to speak of) plus a target decode of
# k+1 tokens.  The target alone emits one token per one-token decode.  Each pass the
# policy picks whichever promises the most tokens per second: the target alone, or one
# proposal at one length.
#
# Acceptance is learned per (source, key) as decayed counts kept by the decoder across
# generations (AcceptanceModel).  Where nothing pays on the posterior mean, a proposer
# is tried anyway only when the probe's expected value beats its cost: the chance that
# its acceptance is high enough to pay, times what that would save over the tokens
# left, times the share of the uncertainty one probe removes, against the time the
# probe loses if acceptance is what the mean says.  Where no acceptance at all can pay
# (a draft model too slow for its target on this machine), it is never tried.

from libc.math cimport log, exp, sqrt

cdef enum:
    N_BUCKETS = 10         # draft-model acceptance by its own confidence, 0.1 wide
    N_GRID = 24            # points of the acceptance posterior in the probe's value
    REALIZED_PRIOR = 16    # pseudo-passes behind the realized/predicted correction's prior of 1
    CATCHUP_SMALL = 8      # a draft catch-up of up to this many tokens is priced per token like a decode
    N_TGAP = 8             # the target's certainty, by the gap between its two best logits
    LEN_KEEP = 16          # generation lengths kept (the newest weigh most: LEN_DECAY)

# The draft model is run only where its predicted rate beats the target alone's by this
# factor: its cost is the one the model gets wrong most (a draft decode between target
# passes runs slower than when timed alone, and its confidence over-promises on text it
# knows less well), and running it where it does not pay loses more than the margin gives up.
cdef double DRAFT_MARGIN = 1.08
# Starting the draft on a long read (the prompt, at an answer's start; what it missed while
# set aside) is a one-off cost paid before anything is known of how the draft does on this
# text, against a saving spread over an answer whose length is a guess: a short answer
# never pays it back.  The draft is started on such a read only where, the read and
# DRAFT_MARGIN counted, it still promises DRAFT_START_EDGE times the best other choice's
# rate (the target alone's, or a free proposer's): a bet of a fraction of a percent is not
# worth the ~10 % a short answer loses.  (Policy
# what-if, draft mode as the bench runs it: at the fifty-fourth session's fast Zen 4 costs
# translation-2, a 29-token answer its draft started on at a 0.6 % edge, 0.915x -> 1.000x,
# overall 1.113x -> 1.115x, coding 1.250x -> 1.246x; at the fifty-fifth's newcomer costs
# 1.199x either way; at a Mac-like curve 1.048x -> 1.050x, chat 0.968x -> 1.000x, math
# 1.283x -> 1.264x.)  Routine catch-ups (up to CATCHUP_SMALL tokens) are chosen on the
# rate alone.
cdef double DRAFT_START_EDGE = 1.03
DRAFT_START_EDGE_FACTOR = DRAFT_START_EDGE    # (for Python: tests)
# A windowed draft's catch-up (a long prompt read as its head and last window) is priced at
# WINDOW_CATCHUP_MARGIN times its cost: it is paid at once, before anything is known of how
# the draft does on this text, on the strength of the window's factor (a fit over six
# answers) and of the answer running as long as recent ones, and where either is wrong (a
# 21-token rag answer after 100-token ones) nothing pays it back.  A margin on every
# catch-up cost the bench's edits (their read-all decisions) and a Mac-like curve's chat
# more than it saved; on the windowed one alone, the policy what-if replaying the bench
# (three cost sets) kept rag at 1.000x instead of 0.96-0.97x and lost nowhere but one edit
# cell (see docs/measurements.md, thirty-sixth session).
cdef double WINDOW_CATCHUP_MARGIN = 1.5
# Reading all of a long prompt the draft skipped is a bet on the answer's length that no
# recent answer can settle (a 13-token extraction after 128-token answers; a 52-token
# summary after longer ones): its cost is spread over no more tokens than the answer has
# run, or READ_ALL_HORIZON while it has run fewer (an answer that has run n tokens is as
# likely to end within n more as to run on; see AcceptanceModel.one_off_future).  So is a
# windowed catch-up of a long read (the draft started on a long prompt, or on what it missed
# while set aside): once capped with the rest it kept the draft off a 128-token rag answer
# (thirty-sixth session), but the recent lengths it was spread over come from other texts: on
# held-out Spec-Bench prompts the draft started on a 10-token rag answer and a 14-token
# extraction at their first token after 128-token answers, 0.54x and 0.68x (policy what-if at
# that run's costs; measured 0.6x).  Capped: those 1.000x, held-out draft mode 1.251x ->
# 1.259x; the default prompts 1.192x -> 1.189x (extraction-1 1.339x -> 1.225x, its draft
# started later), combined 1.551x -> 1.546x; Spec-Bench's first turns unchanged (see
# docs/measurements.md, fifty-eighth session).
# Reading all of the prompt before the answer could show a run of copies (COPY_RUN_MIN tokens)
# is spread over more than that, as often as recent long prompts' answers copied the part a
# windowed draft skips at length (AcceptanceModel.copies_at_length: a run of code edits): the
# horizon plus that share of the rest of the answer expected (Generator._choose).  The bench's
# edits in draft mode read their prompt's head and window at the first token (or the target
# went alone for 8 tokens), ran the windowed draft at 0.65-0.75 acceptance until a run of 16
# copies, then read all of it (1.1-1.4 s) at the 19th-26th token: auto 1.51x against a fixed
# n 8's 1.76x, which reads it all at once (seventy-fourth session).  Now the edits after the
# first read it all at the first token: auto 1.77x against n 8's 1.79x (0.99; summarisation
# 1.04; see docs/measurements.md, seventy-fifth session).
cdef int READ_ALL_HORIZON = 16
READ_ALL_HORIZON_TOKENS = READ_ALL_HORIZON   # (for Python: tests)

cdef double REALIZED_MIN = 0.5, REALIZED_MAX = 1.2   # the correction's range

# What a draft model's tokens are accepted at before any was verified: a draft is chosen to
# match its target (same family, same tokenizer), for which 65-80 % is what is commonly
# reported; worth DRAFT_PRIOR_N tokens of evidence, so that one rejected token (the first of
# an answer is the hardest to guess) does not set a good draft aside.  Other proposers
# start from a uniform prior (their own confidence, where they give one).
cdef double DRAFT_PRIOR_MEAN = 0.7
cdef double DRAFT_PRIOR_N = 4.0
cdef double DRAFT_CARRY_N = 4.0     # evidence carried into a new generation (see new_generation)

# A free proposer's acceptance is learned per key across generations (its evidence comes
# mostly from other texts: one conversation's copies vouch for another's), and so is the
# draft model's by its own confidence.  Within a generation, what a proposer's verified
# tokens were predicted to give is also set against what they gave; where they gave
# less, its chances are scaled by (accepted + CALIB_N) / (predicted + CALIB_N): at the
# mean chances a proposer earns, the ratio stays near 1; one that over-promises here is
# set aside after a pass or two instead of after its carried evidence has faded.  (For
# the draft model, tokens it drafted and those a catch-up looked at both count.)
cdef double CALIB_N = 2.0

# A free proposer's counts per key fade by this much at each new generation (the draft
# model's by half, and capped: DRAFT_CARRY_N): how a key does (a suffix match of two
# tokens, lookup's copy in progress) is mostly the proposer's own, and each generation
# offers a key only a few times; halved like the draft's, a short match's record from
# the generations before was worth little more than its confidence prior, which
# over-promises (multi-turn, traced: suffix matches of up to 5 tokens predicted ~2.0
# tokens a two-token pass and gave ~1.5).  Policy what-if, the twentieth session's
# newcomer costs held: lookup 1.235x -> 1.240x, combined 1.229x -> 1.237x (lowest category
# 0.968x -> 0.977x), multi-turn 5 a category 1.153x -> 1.156x (lowest 0.971x -> 0.982x).
cdef double FREE_KEEP = 0.8

# generation lengths: each older one of the LEN_KEEP kept weighs this much of the next
# (see AcceptanceModel.future)
cdef double LEN_DECAY = 0.8

# Greedy: the target's own certainty at each token it emits (the gap between its two best
# logits) is free evidence of how the draft model would do on this text, before the draft
# has read any of it: where the target is sure, the draft nearly always agrees (on the
# default pair, 93-100 % of tokens with target probability > 0.9 on every bench prompt;
# 31-70 % of the others), and answers differ mostly in how many such tokens they have
# (code, math, extraction: 70-95 %; chat and qa: 13-30 %).  The draft's agreement by gap
# bucket is learned across generations from drafted tokens and catch-up looks; this
# generation's tokens, weighed by it, are pseudo-evidence of the draft's acceptance here
# worth at most TGAP_SOFT_N tokens (an answer's mix of sure and unsure tokens predicts its
# acceptance to within about 0.1 on the bench prompts: ~20 tokens' worth), half of that
# while the table holds only its prior, all of it once TGAP_TRUST tokens were learned.
# The prior: a draft of the target's family agrees where the target is sure and about as
# often as not where its two best are close (TGAP_PRIOR, worth 2 tokens a bucket).
# TGAP_KEEP: tokens per bucket kept across generations.  Where the table over-promises
# (translation: the draft disagrees even where the target is sure), the draft's own
# tokens verified or looked at here outweigh it as they come; the table is not also
# recalibrated on them (an answer's opening, which a draft guesses worst, would then set
# it aside for the whole answer: no looks come while it is).
cdef double TGAP_SOFT_N = 16.0
# the bucket the loop gives a token copied from the part of the prompt a windowed draft
# skipped (its certainty is kept apart: see Generator._emit, Policy.note_copy_token)
cdef int TGAP_COPY = -2
cdef double TGAP_TRUST = 32.0
cdef double TGAP_KEEP = 256.0
# A draft that caught up with only a window of a long prompt (DRAFT_HEAD + DRAFT_WINDOW
# tokens) agrees with the target less than its certainty table says of a draft that read
# it all, beyond the copies that are kept apart (TGAP_COPY): the answer draws on the
# stretch it skipped in ways no n-gram shows.  Teacher-forced on the bench's long-prompt
# answers (the default pair, the window taken at the 16th token; bench/draft_window.py),
# against reading it all: extraction 0.89 / 0.98 and 0.84 / 0.86, summaries 0.40 / 0.72
# and 0.53 / 0.84, rag 0.60 / 0.80 and 1.00 / 1.00.  So a windowed draft's acceptance from the target's certainty is
# scaled by a factor; reading all of the prompt is then weighed against it (Generator._choose).
# The more of the prompt the window leaves unread, the more the answer draws on what the draft
# did not see: in those runs the factor falls about in step with the share u of the prompt
# unread when the window was taken (u = 0.62 for both summaries, 0.50 / 0.33 rag, 0.30 / 0.08
# extraction; 1 - factor against u fitted through 0: slope 0.54, taken as 0.55).  So the factor is
# g (1 - WIN_SLOPE u), u the share the draft (or its catch-up) leaves unread on this text, and
# the scale g learned across generations from a windowed draft's own tokens and looks against
# what the table times the slope's term said of them (they do not teach the table), starting
# at WIN_PRIOR worth WIN_PRIOR_N tokens.  One factor for all texts (it was 0.85 at first,
# learned to ~0.94 on the bench's extraction answers, a fifth of their prompt unread) promised
# a summary whose window left 70 % of its text unread 0.68 where its draft was kept at 0.44.
cdef double WIN_PRIOR = 1.0
cdef double WIN_SLOPE = 0.55
cdef double WIN_PRIOR_N = 16.0
cdef double WIN_KEEP = 256.0
# Attention: every query of a pass reads the whole cache, so a pass of n tokens after L cached
# tokens costs n * attn * L on top of its weights' share (default target, 2-core Zen 4:
# after 200 / 1,500 cached tokens t(1) 31 / 40 ms, t(8) 94 / 157 ms: t(8)/t(1) 3.0 / 3.9).
# attn is measured where the context jumps (a new prompt, a new turn): the cost model has
# followed the machine's pace up to the jump, so its surprise (the model as it was at the
# jump) at the ATTN_AFTER passes after the first one after it (of any size n; each at least
# ATTN_MIN_JUMP tokens from where that size was last seen, L - cx[n]) is the attention it has
# not priced, n (L - cx[n]) times the error in attn (the first pass after a prompt's prefill
# finds much of its cache still in the CPU's caches): each jump gives one reading of attn,
# and attn is the median of the last ATTN_JUMPS readings (0 before ATTN_MIN_READINGS of
# them), kept relative to the machine's pace like every cost.  Not a line through every
# pass's time against its context: a slow spell that fell on one long prompt is the pace's,
# not the context's, and a median leaves it out (the fiftieth session's Spec-Bench run, with
# such a line: a spell during a 1,000-token summary took attn from 0 to 400 us a cached
# token, after which a one-token pass after 100 tokens was predicted to take a microsecond).
cdef enum:
    ATTN_AFTER = 4         # passes after a jump read (after its first)
    ATTN_JUMPS = 9         # readings kept
    ATTN_MIN_READINGS = 3
cdef double ATTN_MIN_JUMP = 128.0

cdef float TGAP_EDGES[N_TGAP - 1]
TGAP_EDGES[:] = [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
cdef double TGAP_PRIOR[N_TGAP]
TGAP_PRIOR[:] = [0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98]


TARGET_GAP_EDGES = tuple(TGAP_EDGES[i] for i in range(N_TGAP - 1))   # (for Python: tests, the docs)


cdef inline double _win_shape(double unread) noexcept nogil:
    """How a windowed draft's agreement falls with the share of the prompt it leaves unread
    (see WIN_SLOPE)."""
    return 1.0 - WIN_SLOPE * _clip(unread, 0.0, 1.0)


cdef double _share_checked(x) except -1.0:
    cdef double u = x
    if not (0.0 <= u <= 1.0):
        raise ValueError(f"unread must be a share between 0 and 1, got {x!r}")
    return u


cdef int _gap_bucket_checked(gap) except -1:
    cdef double g = gap
    if not (g >= 0.0):
        raise ValueError(f"gap must be a number >= 0, got {gap!r}")
    return tgap_bucket(<float>g)


cdef inline int tgap_bucket(float gap) noexcept nogil:
    """The bucket of a gap (logits) between the target's two most likely tokens."""
    cdef int b = 0
    while b < N_TGAP - 1 and gap >= TGAP_EDGES[b]:
        b += 1
    return b


cdef inline double _clip(double x, double lo, double hi) noexcept nogil:
    return lo if x < lo else (hi if x > hi else x)


cdef inline void _moving_mean(double * mean, int * n, double x) noexcept nogil:
    """Take x into a moving mean of n values so far (the first sets it; then each moves it
    0.3 of the way), counting it."""
    if n[0] == 0:
        mean[0] = x
    else:
        mean[0] += 0.3 * (x - mean[0])
    n[0] += 1


cdef inline void _take_back(double * hits, double * tries, double h, double t) noexcept nogil:
    """Counts of kept / tried less h kept of t tried, kept within 0 <= hits <= tries."""
    hits[0] = _clip(hits[0] - h, 0.0, hits[0])
    tries[0] = tries[0] - t if tries[0] - t > hits[0] else hits[0]


cdef int _source_index(source) except? -2:
    """A proposer's source id from its name or id; -1 if it is neither."""
    if isinstance(source, str):
        return SOURCE_NAMES.index(source) if source in SOURCE_NAMES else -1
    return source if isinstance(source, int) else -1


def calibration_rounds(int max_n, int fit):
    """The batch sizes each of the calibration's three rounds times, for verification of up
    to ``max_n`` tokens where ``fit`` more fit the target's context: every size from 2 to 9
    in each round, then 12, 13, 16, 17, ... (the sizes between are interpolated) in the
    first two.  A shape's first pass in a process pays one-off costs (15-40 % of a 12-16-token
    pass on a 2-core CPU), so a size timed once is timed at its dearest."""
    sizes = [n for n in range(2, max_n + 1) if (n <= 9 or n % 4 in (0, 1)) and n <= fit]
    return [[n for n in sizes if n <= 9 or r < 2] for r in range(3)]


def calibrated_costs(rounds):
    """Seconds per target decode of n tokens from calibration rounds, each
    ``(one-token seconds before, {n: seconds}, one-token seconds after)``: a size is kept as
    the least over rounds of its ratio to its round's one-token time (the mean of the two
    beside it), times the median one-token time.  A slow spell of the machine over a whole
    round moves a size and its reference alike; one over a size alone (outside load, which
    only ever slows a pass) makes its ratio higher, and the least ratio leaves it out even
    where it hit that size in most rounds.  Erring low is the cheaper way to err: a size
    the policy thinks cheap is used, timed and corrected within a few passes, while one it
    thinks dear is never used and so never timed again (a sweep whose calibration met
    another process kept t(8)/t(1) at 4.4-6.2 against a real 2.2 for the whole run).
    Returns {1: seconds, n: seconds, ...}."""
    ones = []
    ratios = {}
    for before, taken, after in rounds:
        if not (before > 0.0 and after > 0.0):
            raise ValueError("one-token times must be > 0")
        ones += [before, after]
        for n, secs in taken.items():
            if not (n >= 2 and secs > 0.0):
                raise ValueError(f"need sizes >= 2 and seconds > 0, got {n}: {secs}")
            ratios.setdefault(n, []).append(secs / (0.5 * (before + after)))
    if not ones:
        raise ValueError("no calibration rounds")
    ones.sort()
    m = len(ones) // 2
    t1 = ones[m] if len(ones) % 2 else 0.5 * (ones[m - 1] + ones[m])
    out = {1: t1}
    for n, v in ratios.items():
        out[n] = t1 * min(v)
    return out


def _cached_tokens(context):
    """``context`` as a number of cached tokens (an int >= 0), else a ValueError."""
    if not isinstance(context, bool):
        try:
            n = operator.index(context)
        except TypeError:
            n = -1
        if 0 <= n < 2 ** 31:
            return n
    raise ValueError(f"context must be a number of cached tokens (an int >= 0), got {context!r}")


cdef class CostModel:
    """Measured costs of one target/draft pair on this machine: seconds per one-token
    draft decode and per target decode of n tokens (n = 1..MAX_DRAFT+1).  A decoder
    keeps one across generations so that what was measured is not measured again.
    Every time is kept relative to the machine's current pace (``speed``, which every
    target pass updates): outside load slows both models alike, so a draft timed during
    a slow spell does not look dear for good once the spell is over."""
    cdef double t_draft_est              # draft: one-token decode, relative to ``speed``
    cdef double t_catchup_tok            # draft: per extra token of a long catch-up decode (relative)
    cdef int n_catchup_obs
    cdef double t_catchup_small          # the same for catch-ups of 2..CATCHUP_SMALL tokens
    cdef int n_small_obs
    cdef double t_verify_est[MAX_DRAFT + 2]   # per size, relative to ``speed``, at context cx[n]
    cdef int n_verify_obs[MAX_DRAFT + 2]
    cdef double cx[MAX_DRAFT + 2]        # cached tokens at which t_verify_est[n] was seen (a mean)
    cdef double attn                     # per query per cached token, relative to ``speed`` (see ATTN_AFTER)
    # its readings (see ATTN_AFTER): the last pass's context (-1: none), the passes seen since
    # the latest jump, the model as it was then, the sum and count of what the passes read
    # implied, the last ATTN_JUMPS readings
    cdef int a_last_ctx
    cdef int a_after
    cdef double a_speed
    cdef double a_t[MAX_DRAFT + 2]
    cdef double a_cx[MAX_DRAFT + 2]
    cdef double a_sum
    cdef int a_cnt
    cdef double a_read[ATTN_JUMPS]
    cdef int a_n_read
    cdef public int context              # cached tokens before the next pass (the loop sets it)
    cdef double speed                    # the machine's current pace, common to every size
    cdef int last_n                      # the size of the pass observed last (0: none yet)
    cdef public bint calibrated
    cdef public bint hold                # keep the costs as they are (set(): tests, what-if runs)

    def __cinit__(self):
        self.reset()

    def set(self, *, double draft_time=0.0, verify_times=None, catchup_time=None,
            double attn_time=0.0, int at_context=0, bint hold=True):
        """Set the costs instead of measuring them (tests, and what-if runs of the policy):
        ``verify_times`` {n: seconds} for target decodes of n tokens after ``at_context``
        cached tokens (others interpolated), ``draft_time`` seconds per draft token,
        ``attn_time`` seconds per query per cached token (a pass of n tokens after L costs
        n * attn_time * (L - at_context) more).  With ``hold`` the measurements taken while
        generating do not change them.  Marks the model calibrated."""
        self.reset()
        if draft_time < 0.0:
            raise ValueError("draft_time must be >= 0")
        if not attn_time >= 0.0 or at_context < 0:
            raise ValueError("attn_time and at_context must be >= 0")
        self.attn = attn_time          # (speed is 1 after reset)
        self.t_draft_est = draft_time
        for n, secs in (verify_times or {}).items():
            if not (1 <= n <= MAX_DRAFT + 1) or not secs > 0.0:
                raise ValueError(f"verify_times: need 1 <= n <= {MAX_DRAFT + 1} and seconds > 0, got {n}: {secs}")
            self.t_verify_est[n] = secs
            self.n_verify_obs[n] = 1
            self.cx[n] = at_context
        if catchup_time is not None:
            self.t_catchup_tok = self.t_catchup_small = catchup_time
            self.n_catchup_obs = self.n_small_obs = 1
        self.calibrated = True
        self.hold = hold

    def state(self):
        """What was measured, as plain numbers (JSON-able; ``restore`` takes it back):
        ``verify`` {n: seconds} for each target decode size measured and ``context`` {n:
        cached tokens} where it was seen, ``draft`` seconds per draft token (None until
        measured), ``catchup`` and ``catchup_small`` seconds per extra token of a long and a
        short draft catch-up (None until seen), each at the machine's current pace."""
        cdef int n
        ns = [n for n in range(1, MAX_DRAFT + 2) if self.n_verify_obs[n] > 0]
        return dict(verify={n: self.speed * self.t_verify_est[n] for n in ns},
                    context={n: self.cx[n] for n in ns},
                    draft=self.speed * self.t_draft_est if self.t_draft_est > 0.0 else None,
                    catchup=self.speed * self.t_catchup_tok if self.n_catchup_obs > 0 else None,
                    catchup_small=self.speed * self.t_catchup_small if self.n_small_obs > 0 else None)

    def restore(self, state):
        """Take back what ``state()`` gave (another process's calibration of the same pair on
        the same machine, say: a decoder's cost cache) and mark the model calibrated; the
        passes that follow go on refining it as they would a calibration's (``hold`` off).
        A ValueError, the model left as it was, where ``state`` is not such a dict."""
        try:
            verify = {int(n): float(t) for n, t in state["verify"].items()}
            context = {int(n): float(c) for n, c in (state.get("context") or {}).items()}
            extra = {k: (None if state.get(k) is None else float(state[k]))
                     for k in ("draft", "catchup", "catchup_small")}
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise ValueError(f"not a cost model state: {e!r}") from None
        if 1 not in verify:
            raise ValueError("a cost model state needs the one-token pass's time (verify[1])")
        for n, t in verify.items():
            if not (1 <= n <= MAX_DRAFT + 1) or not (t > 0.0 and t < 1e9):
                raise ValueError(f"verify: need 1 <= n <= {MAX_DRAFT + 1} and seconds > 0, got {n}: {t}")
        for n, c in context.items():
            if n not in verify or not (0.0 <= c < 2.0 ** 31):
                raise ValueError(f"context: need a measured size and cached tokens >= 0, got {n}: {c}")
        for k, v in extra.items():
            if v is not None and not (0.0 <= v < 1e9):
                raise ValueError(f"{k} must be seconds >= 0, got {v}")
        self.set(draft_time=extra["draft"] or 0.0, verify_times=verify, hold=False)
        for n in verify:
            self.cx[n] = context.get(n, 0.0)
        if extra["catchup"] is not None:
            self.t_catchup_tok = extra["catchup"]
            self.n_catchup_obs = 1
        if extra["catchup_small"] is not None:
            self.t_catchup_small = extra["catchup_small"]
            self.n_small_obs = 1

    def reset(self):
        """Forget every measurement."""
        self.t_draft_est = 0.0
        self.t_catchup_tok = 0.0
        self.n_catchup_obs = 0
        self.t_catchup_small = 0.0
        self.n_small_obs = 0
        for i in range(MAX_DRAFT + 2):
            self.t_verify_est[i] = 0.0
            self.n_verify_obs[i] = 0
            self.cx[i] = 0.0
        self.attn = 0.0
        self.a_last_ctx = -1
        self.a_after = ATTN_AFTER + 1
        self.a_sum = 0.0
        self.a_cnt = self.a_n_read = 0
        self.context = 0
        self.speed = 1.0
        self.last_n = 0
        self.calibrated = False
        self.hold = False

    @property
    def draft_time(self):
        """Seconds per one-token draft decode at the machine's current pace (0.0 until
        measured)."""
        return self.t_draft()

    @property
    def catchup_time(self):
        """Seconds per extra token when the draft model catches up after a long pause
        (a batched decode of many tokens)."""
        return self.t_catchup_cost(CATCHUP_SMALL + 1)

    @property
    def catchup_small_time(self):
        """Seconds per extra token when the draft model is a few tokens behind (as after
        every pass whose drafts were all accepted)."""
        return self.t_catchup_cost(2)

    @property
    def verify_times(self):
        """{n: seconds} for the target decode sizes measured so far, each at the context
        (cached tokens) where it was seen on average."""
        return {n: self.speed * self.t_verify_est[n] for n in range(1, MAX_DRAFT + 2) if self.n_verify_obs[n] > 0}

    @property
    def attn_time(self):
        """Seconds each query of a pass spends per cached token (attention), read from the
        passes just after the context's jumps (a new prompt); 0.0 until three jumps of 128
        tokens or more were seen."""
        return self.speed * self.attn

    def verify_time(self, int n, context):
        """Estimated seconds of a target decode of n tokens after ``context`` cached tokens."""
        if not (1 <= n <= MAX_DRAFT + 1):
            raise ValueError(f"need 1 <= n <= {MAX_DRAFT + 1}")
        return self._t_verify_at(n, _cached_tokens(context))

    cdef inline double t_draft(self) noexcept nogil:
        """Seconds per one-token draft decode now."""
        return self.speed * self.t_draft_est

    cdef inline void observe_draft(self, double secs) noexcept nogil:
        if self.hold:
            return
        secs /= self.speed
        if self.t_draft_est == 0.0:
            self.t_draft_est = secs
        else:
            self.t_draft_est += 0.1 * (_clip(secs, 0.5 * self.t_draft_est, 1.5 * self.t_draft_est)
                                       - self.t_draft_est)

    cdef void observe_draft_ratio(self, double ratio) noexcept nogil:
        """Calibration: a draft token took ``ratio`` target one-token passes timed beside it
        (the median of a few).  Sets the draft's estimate outright from the target's
        one-token figure: a slow spell during one draft decode moves its reference too, and
        a draft estimate left too high would keep the draft from ever running (and so from
        ever being timed again) for the rest of the session."""
        if self.hold or not ratio > 0.0:
            return
        cdef double c
        self.t_draft_est = ratio * self._t_verify_base(1, &c)

    cdef void observe_catchup(self, int n, double secs) noexcept nogil:
        """A draft decode of n >= 2 tokens (catching up) took secs."""
        if self.hold or n < 2:
            return
        cdef double per = (secs / self.speed - self.t_draft_est) / (n - 1)
        if per < 0.0:
            per = 0.0
        if n <= CATCHUP_SMALL:
            if self.n_small_obs == 0:
                self.t_catchup_small = per
            else:
                self.t_catchup_small += 0.2 * (per - self.t_catchup_small)
            self.n_small_obs += 1
        elif self.n_catchup_obs == 0:
            self.t_catchup_tok = per
            self.n_catchup_obs += 1
        else:
            self.t_catchup_tok += 0.3 * (per - self.t_catchup_tok)
            self.n_catchup_obs += 1

    cdef inline double t_catchup_cost(self, int n_behind) noexcept nogil:
        """Seconds per extra token of a catch-up decode of n_behind tokens.  Priors before
        any was seen: a few tokens cost a decode each (CPU kernels are nearly linear at
        small batches), a long batch a third of one."""
        if n_behind <= CATCHUP_SMALL:
            return self.speed * (self.t_catchup_small if self.n_small_obs > 0 else self.t_draft_est)
        return self.speed * (self.t_catchup_tok if self.n_catchup_obs > 0 else self.t_draft_est / 3.0)

    def record_verify(self, int n, double seconds, context=None):
        """Record that a target decode of n tokens took ``seconds`` after ``context``
        cached tokens (default: ``self.context``), what the loop does after every pass;
        for tests and what-if runs.  Ignored while ``hold`` is set."""
        if not (1 <= n <= MAX_DRAFT + 1) or not seconds > 0.0:
            raise ValueError(f"need 1 <= n <= {MAX_DRAFT + 1} and seconds > 0")
        self.observe_verify(n, seconds, self.context if context is None else _cached_tokens(context))

    cdef inline void observe_verify(self, int n, double secs, int context) noexcept nogil:
        """A target decode of n tokens after ``context`` cached tokens took secs.  What the
        context explains (see ATTN_AFTER) is taken off; of the surprise left, half goes to
        the machine's pace (every size: other work on the machine slows them all, and the
        policy compares sizes with each other), half to this size; one pass moves its
        estimate by at most ~10 %, so a single slow pass does not skew every decision.  A
        pass of the same size as the one before it tells nothing of the sizes against each
        other (a run of one-token passes, the target alone, only says how fast the machine
        is now): all of its surprise goes to the pace, so the sizes' ratios (what decides
        whether proposing pays) stay as they were measured side by side.  (Half to the size
        there too, a slow spell of one-token passes made every other size and the draft look
        ~10 % cheaper against the target alone; a 12-token translation on a Zen 1 then
        started its draft mid-spell and ran 0.83x.)"""
        cdef double f, d, L = context
        if self.hold:
            return
        self._fit_attn(n, context, secs)
        if self.n_verify_obs[n] == 0:
            self.t_verify_est[n] = secs / self.speed
            self.cx[n] = L
        else:
            f = 1.0 + 0.1 * (_clip(secs / self._t_verify_at(n, L), 0.5, 1.5) - 1.0)
            if n == self.last_n:
                self.speed *= f * f
            else:
                self.speed *= f
                self.t_verify_est[n] *= f
            # the size's reference context follows where it is used; its time moves with it
            d = 0.1 * (L - self.cx[n])
            self.cx[n] += d
            self.t_verify_est[n] += n * self.attn * d
            if self.t_verify_est[n] < 1e-6:
                self.t_verify_est[n] = 1e-6
        self.n_verify_obs[n] += 1
        self.last_n = n

    cdef void _fit_attn(self, int n, int L, double secs) noexcept nogil:
        """A target decode of n tokens after L cached tokens took secs (before the model
        learns from it): what it says of attn if the context jumped shortly before it (see
        ATTN_AFTER)."""
        cdef double lever, e
        if self.a_last_ctx >= 0 and (L < self.a_last_ctx or L > self.a_last_ctx + MAX_DRAFT + 1):
            self._attn_reading()
            self.a_after = 0
            self.a_speed = self.speed
            memcpy(self.a_t, self.t_verify_est, sizeof(self.a_t))
            memcpy(self.a_cx, self.cx, sizeof(self.a_cx))
            # (attn itself changes only as a jump's reading is done: it is the jump's too)
        self.a_last_ctx = L
        if self.a_after > ATTN_AFTER:
            return
        self.a_after += 1
        lever = L - self.a_cx[n]
        if self.a_after > 1 and self.a_t[n] > 0.0 and (lever >= ATTN_MIN_JUMP or lever <= -ATTN_MIN_JUMP):
            # the surprise, relative to the pace, over what a change in attn would add
            e = secs / self.a_speed - (self.a_t[n] + n * self.attn * lever)
            self.a_sum += self.attn + e / (n * lever)
            self.a_cnt += 1
        if self.a_after > ATTN_AFTER:
            self._attn_reading()

    cdef void _attn_reading(self) noexcept nogil:
        """What the passes read after the latest jump implied (if any), into the kept
        readings; attn their median (never negative)."""
        cdef double x
        cdef double v[ATTN_JUMPS]
        cdef int i, j, m
        if self.a_cnt == 0:
            return
        self.a_read[self.a_n_read % ATTN_JUMPS] = self.a_sum / self.a_cnt
        self.a_n_read += 1
        self.a_sum = 0.0
        self.a_cnt = 0
        m = self.a_n_read if self.a_n_read < ATTN_JUMPS else ATTN_JUMPS
        if m < ATTN_MIN_READINGS:
            return
        for i in range(m):                  # insertion sort of a few numbers
            x = self.a_read[i]
            j = i
            while j > 0 and v[j - 1] > x:
                v[j] = v[j - 1]
                j -= 1
            v[j] = x
        x = v[m // 2] if m % 2 else 0.5 * (v[m // 2 - 1] + v[m // 2])
        self.attn = x if x > 0.0 else 0.0

    cdef double t_verify(self, int n) noexcept nogil:
        """Estimated time of a target decode of n tokens at the machine's current pace,
        after ``context`` cached tokens."""
        return self._t_verify_at(n, self.context)

    cdef double _t_verify_at(self, int n, double L) noexcept nogil:
        cdef double c
        cdef double b = self.speed * self._t_verify_base(n, &c)
        cdef double t = b + n * self.speed * self.attn * (L - c)
        # (a size seen only far from L: never below a third of what it was seen to cost)
        return t if t > b / 3.0 else b / 3.0

    cdef double _t_verify_base(self, int n, double * ctx) noexcept nogil:
        """Estimated time of a target decode of n tokens (relative to ``speed``) and the
        context it holds at (ctx): the measured figure where there is one, else
        interpolated between measured sizes, else a prior that grows by 20% of a
        single-token pass per extra token (what a CPU shows)."""
        cdef int lo = n, hi = n
        cdef double w
        ctx[0] = 0.0
        if self.n_verify_obs[n] > 0:
            ctx[0] = self.cx[n]
            return self.t_verify_est[n]
        while lo > 0 and self.n_verify_obs[lo] == 0:
            lo -= 1
        while hi < MAX_DRAFT + 1 and self.n_verify_obs[hi] == 0:
            hi += 1
        if lo > 0 and hi <= MAX_DRAFT + 1 and self.n_verify_obs[hi] > 0:
            w = (n - lo) / <double>(hi - lo)
            ctx[0] = self.cx[lo] + (self.cx[hi] - self.cx[lo]) * w
            return self.t_verify_est[lo] + (self.t_verify_est[hi] - self.t_verify_est[lo]) * w
        if lo > 0:
            ctx[0] = self.cx[lo]
            return self.t_verify_est[lo] * (1.0 + 0.2 * (n - 1)) / (1.0 + 0.2 * (lo - 1))
        if hi <= MAX_DRAFT + 1 and self.n_verify_obs[hi] > 0:
            ctx[0] = self.cx[hi]
            return self.t_verify_est[hi] * (1.0 + 0.2 * (n - 1)) / (1.0 + 0.2 * (hi - 1))
        if self.t_draft_est > 0.0:
            return 2.5 * self.t_draft_est * (1.0 + 0.2 * (n - 1))
        return 1.0 + 0.2 * (n - 1)          # nothing measured: relative units


cdef class AcceptanceModel:
    """What the target has accepted, per proposer: for each (source, key) decayed counts
    of proposed tokens that reached the target (tries) and were kept (hits), and for the
    draft model the same by its own confidence.  A decoder keeps one across generations
    (``decoder.acceptance``); older evidence fades (at each new generation to FREE_KEEP of
    it, the draft model's to half, and a little each pass in which a proposer could have
    been used but was not), so that a proposer set aside on one kind of text is tried
    again, when that is worth it, on another."""
    # (a field added here goes into restore() too)
    cdef double hits[N_SOURCES][N_KEYS]
    cdef double tries[N_SOURCES][N_KEYS]
    cdef double conf_hits[N_BUCKETS]
    cdef double conf_tries[N_BUCKETS]
    # per source, over its passes: tokens and seconds the policy predicted, and what they
    # really gave (the correction of its rates by what they delivered on this machine)
    cdef double pred_tok[N_SOURCES]
    cdef double pred_sec[N_SOURCES]
    cdef double real_tok[N_SOURCES]
    cdef double real_sec[N_SOURCES]
    # how many tokens this decoder's generations run (a moving average; see
    # Generator._note_finish): what a draft's catch-up and a probe's evidence can serve
    cdef double len_mean
    cdef int len_n
    cdef int len_hist[LEN_KEEP]           # the last LEN_KEEP lengths, newest at len_n % LEN_KEEP - 1
    # before any has ended by itself: how long those cut by max_tokens ran (at least that long)
    cdef double cut_mean
    cdef int cut_n
    # the share of recent generations' output that free proposers (lookup, ...) made where the
    # draft model ran beside them (a moving average; see Generator._free_share), kept apart
    # for short prompts [0] and long ones [1] (longer than a windowed draft's head and window)
    cdef double free_mean[2]
    cdef int free_n[2]
    # whether recent long-prompt answers copied the part a windowed draft skips at length (a
    # moving average of 0/1; see Generator._note_finish and READ_ALL_HORIZON)
    cdef double copy_mean
    cdef int copy_n
    # the draft model's agreement with the target by the target's certainty (tgap_bucket)
    cdef double tg_hits[N_TGAP]
    cdef double tg_tries[N_TGAP]
    # a windowed draft's agreement against what the table says of the same tokens
    cdef double win_hits
    cdef double win_pred

    def __cinit__(self):
        self.reset()

    def reset(self):
        """Forget everything seen."""
        memset(self.hits, 0, sizeof(self.hits))
        memset(self.tries, 0, sizeof(self.tries))
        memset(self.conf_hits, 0, sizeof(self.conf_hits))
        memset(self.conf_tries, 0, sizeof(self.conf_tries))
        memset(self.pred_tok, 0, sizeof(self.pred_tok))
        memset(self.pred_sec, 0, sizeof(self.pred_sec))
        memset(self.real_tok, 0, sizeof(self.real_tok))
        memset(self.real_sec, 0, sizeof(self.real_sec))
        self.len_mean = 0.0
        self.len_n = 0
        self.cut_mean = 0.0
        self.cut_n = 0
        memset(self.free_mean, 0, sizeof(self.free_mean))
        memset(self.free_n, 0, sizeof(self.free_n))
        self.copy_mean = 0.0
        self.copy_n = 0
        memset(self.tg_hits, 0, sizeof(self.tg_hits))
        memset(self.tg_tries, 0, sizeof(self.tg_tries))
        self.win_hits = 0.0
        self.win_pred = 0.0

    def copy(self):
        """A new model holding what this one has seen (``restore`` puts it back)."""
        cdef AcceptanceModel out = AcceptanceModel()
        out.restore(self)
        return out

    def restore(self, AcceptanceModel other not None):
        """Make this model hold what ``other`` has seen, and nothing else (the bench
        measures a cell again from the evidence its first measurement started from)."""
        memcpy(self.hits, other.hits, sizeof(self.hits))
        memcpy(self.tries, other.tries, sizeof(self.tries))
        memcpy(self.conf_hits, other.conf_hits, sizeof(self.conf_hits))
        memcpy(self.conf_tries, other.conf_tries, sizeof(self.conf_tries))
        memcpy(self.pred_tok, other.pred_tok, sizeof(self.pred_tok))
        memcpy(self.pred_sec, other.pred_sec, sizeof(self.pred_sec))
        memcpy(self.real_tok, other.real_tok, sizeof(self.real_tok))
        memcpy(self.real_sec, other.real_sec, sizeof(self.real_sec))
        self.len_mean = other.len_mean
        self.len_n = other.len_n
        memcpy(self.len_hist, other.len_hist, sizeof(self.len_hist))
        self.cut_mean = other.cut_mean
        self.cut_n = other.cut_n
        memcpy(self.free_mean, other.free_mean, sizeof(self.free_mean))
        memcpy(self.free_n, other.free_n, sizeof(self.free_n))
        self.copy_mean = other.copy_mean
        self.copy_n = other.copy_n
        memcpy(self.tg_hits, other.tg_hits, sizeof(self.tg_hits))
        memcpy(self.tg_tries, other.tg_tries, sizeof(self.tg_tries))
        self.win_hits = other.win_hits
        self.win_pred = other.win_pred

    @property
    def mean_length(self):
        """Tokens a generation of this decoder has run on average (recent ones weigh most;
        0.0 before the first has finished)."""
        return self.len_mean

    def record_length(self, int n_tokens):
        """Record that a generation ended by itself after ``n_tokens`` (the loop does this
        when one finishes at an end-of-generation token or a stop string; one cut short by
        max_tokens says only that it would have run longer; for tests and what-if runs)."""
        if n_tokens < 0:
            raise ValueError("n_tokens must be >= 0")
        self.observe_length(n_tokens)

    cdef void observe_length(self, int n) noexcept nogil:
        self.len_hist[self.len_n % LEN_KEEP] = n
        _moving_mean(&self.len_mean, &self.len_n, n)

    def record_cut(self, int n_tokens):
        """Record that a generation was cut by max_tokens after ``n_tokens`` (it would have
        run at least that long; the loop does this while none has ended by itself)."""
        if n_tokens < 0:
            raise ValueError("n_tokens must be >= 0")
        self.observe_cut(n_tokens)

    cdef void observe_cut(self, int n) noexcept nogil:
        _moving_mean(&self.cut_mean, &self.cut_n, n)

    @property
    def free_share(self):
        """The share of recent generations' output that free proposers (n-gram lookup, a
        prediction, ...) made where the draft model ran beside them, on short prompts (recent
        ones weigh most; 0.0 before any; see free_share_of)."""
        return self.free_of(False)

    def free_share_of(self, bint long_prompt):
        """free_share, of the generations whose prompt was long (``long_prompt``: longer than
        a windowed draft's head and window, LONG_PROMPT_TOKENS) or short.  Kept apart: what
        lookup makes of an answer follows what the prompt gives it to copy (an edit's code,
        a summary's article), and a mean over both told the draft a code edit's answer would
        be its own after a run of short chat prompts.  A kind not seen yet takes the other's."""
        return self.free_of(long_prompt)

    def record_free_share(self, double share, bint long_prompt=False):
        """Record that free proposers made ``share`` of a generation's output beside the draft
        model, its prompt long or not (the loop does this as one ends; for tests and what-if
        runs)."""
        if not 0.0 <= share <= 1.0:
            raise ValueError("share must be in [0, 1]")
        self.observe_free_share(share, long_prompt)

    cdef inline double free_of(self, bint long_prompt) noexcept nogil:
        cdef int c = long_prompt
        if self.free_n[c] > 0:
            return self.free_mean[c]
        return self.free_mean[1 - c] if self.free_n[1 - c] > 0 else 0.0

    cdef void observe_free_share(self, double share, bint long_prompt) noexcept nogil:
        cdef int c = long_prompt
        _moving_mean(&self.free_mean[c], &self.free_n[c], share)

    @property
    def copies_at_length(self):
        """How often recent long-prompt answers copied the part of the prompt a windowed draft
        skips at length (a run of COPY_RUN_MIN_TOKENS copies; recent ones weigh most; 0.0
        before any): the chance that reading all of the next long prompt serves the answer
        to its end (see Generator._choose)."""
        return self.copy_mean

    def record_copies_at_length(self, bint copied):
        """Record whether a long-prompt answer copied the part of the prompt a windowed draft
        skips at length (the loop does this as one ends; for tests and what-if runs)."""
        self.observe_copies(copied)

    cdef void observe_copies(self, bint copied) noexcept nogil:
        _moving_mean(&self.copy_mean, &self.copy_n, 1.0 if copied else 0.0)

    def tokens_left(self, int generated, int remaining):
        """Tokens a generation that has run ``generated`` (max_tokens allowing ``remaining``
        more) is expected to run on, as the policy reckons them (see future)."""
        if generated < 0 or remaining < 0:
            raise ValueError("generated and remaining must be >= 0")
        return self.future(generated, remaining)

    cdef double future(self, int generated, int remaining) noexcept nogil:
        """Tokens this generation is expected to run on (what a draft's catch-up and a
        probe's evidence can serve), once one of this decoder's generations has ended by
        itself: of the recent lengths still running at ``generated`` (no shorter than it: a
        length counts the tokens before the end token, so one of exactly ``generated`` has its
        last pass, the end token's, still to come), their harmonic mean (newest weighing most)
        less ``generated``; before any has ended, half of what max_tokens
        still allows (answers often end well before the cap: a long prompt's catch-up must
        not be spread over tokens that never come), or, where generations were cut by
        max_tokens before, what those ran less ``generated`` if that is more (this one
        likely runs at least as long), within what max_tokens allows.  Harmonic: a one-off cost c against a
        saving of g a token pays, summed over answers as a share of each answer's time
        (how speed is felt and benched), where g (1/E[1/L] - n) > c: a short answer's loss
        weighs as much as a long one's gain.  Still running: an answer that has outrun the
        short ones is likely a long one, but one that has run exactly as long as a recent one
        may be about to end as it did (counting only the longer ones there made a 16-token
        answer's last pass the place its length was reckoned longest: the draft was started
        there, Spec-Bench translation-161)."""
        cdef double here = remaining, left, w = 1.0, sw = 0.0, sinv = 0.0
        cdef int i, j, n = self.len_n if self.len_n < LEN_KEEP else LEN_KEEP
        if self.len_n == 0:
            here = 0.5 * remaining
            # answers cut by max_tokens before: this one likely runs at least as long
            if self.cut_n > 0 and self.cut_mean - generated > here:
                here = self.cut_mean - generated
                if here > remaining:
                    here = remaining
        else:
            for i in range(n):
                j = (self.len_n - 1 - i) % LEN_KEEP
                if self.len_hist[j] >= generated and self.len_hist[j] > 0:
                    sw += w
                    sinv += w / self.len_hist[j]
                w *= LEN_DECAY
            left = sw / sinv - generated if sinv > 0.0 else 0.0
            if left < 0.25 * self.len_mean:
                left = 0.25 * self.len_mean       # past the usual length: it may still go on
            if left < here:
                here = left
        return here if here > 1.0 else 1.0

    cdef inline double one_off_future(self, int generated, double future) noexcept nogil:
        """Tokens a one-off bet on this answer's length (the draft reading all of a long
        prompt) is spread over: ``future`` (what future() gives), but no more than the
        answer has run so far, or READ_ALL_HORIZON while it has run fewer.  However long the recent answers ran, one
        that has run n tokens is about as likely to end within n more as to go on.  (The
        policy what-if, a bench run's costs held and its history replayed: summarisation-1
        0.878x -> 1.000x, rag-2 0.996x -> 1.000x, extraction-1 1.634x -> 1.526x, draft mode
        1.334x -> 1.336x; Spec-Bench's extraction-131, combined, 0.545x -> 0.699x.)"""
        cdef double cap = generated if generated > READ_ALL_HORIZON else READ_ALL_HORIZON
        return future if future < cap else cap

    def one_off_tokens(self, int generated, int remaining):
        """Tokens the policy spreads a one-off bet on this answer's length over (reading
        all of a long prompt): tokens_left, but no more than ``generated``, or
        READ_ALL_HORIZON while the answer has run fewer."""
        if generated < 0 or remaining < 0:
            raise ValueError("generated and remaining must be >= 0")
        return self.one_off_future(generated, self.future(generated, remaining))

    def realized(self, source, double t1=1.0):
        """Predicted over measured time of ``source``'s passes (1.0 = as predicted; below 1
        they took longer; the policy scales that source's predicted rates by it).  ``t1``:
        seconds of a one-token target pass (the prior's time scale)."""
        cdef int s = _source_index(source)
        if not (0 < s < N_SOURCES):
            raise ValueError("unknown source")
        return self.correction(s, t1)

    def record_pass(self, source, double predicted_tokens, double predicted_seconds, int tokens, double seconds):
        """Record one pass of ``source``: predicted to give ``predicted_tokens`` in
        ``predicted_seconds``, it gave ``tokens`` in ``seconds`` (the loop does this after each
        pass of a proposer; exposed for tests and what-if runs)."""
        cdef int s = _source_index(source)
        if not (0 < s < N_SOURCES):
            raise ValueError("unknown source")
        self.observe_pass(s, predicted_tokens, predicted_seconds, tokens, seconds)

    cdef void observe_pass(self, int s, double e_pred, double t_pred, int emitted, double secs) noexcept nogil:
        """A pass of source s was predicted to give e_pred tokens in t_pred seconds and gave
        ``emitted`` in ``secs``."""
        if e_pred <= 0.0 or t_pred <= 0.0 or secs <= 0.0:
            return
        self.pred_tok[s] += e_pred
        self.pred_sec[s] += t_pred
        self.real_tok[s] += emitted
        self.real_sec[s] += secs

    cdef double correction(self, int s, double t1) noexcept nogil:
        """(predicted seconds) / (seconds taken) over s's passes, each side starting from
        REALIZED_PRIOR passes' worth of t1 (so it is 1 until evidence says otherwise), clipped
        to [REALIZED_MIN, REALIZED_MAX].  Time only: how many tokens a proposer's passes
        give is what the acceptance counts learn, per key; this corrects what the cost
        model does not see (a draft slower between target passes than when timed alone,
        a proposer's own work)."""
        cdef double w = REALIZED_PRIOR
        if t1 <= 0.0:
            return 1.0
        return _clip((self.pred_sec[s] + w * t1) / (self.real_sec[s] + w * t1), REALIZED_MIN, REALIZED_MAX)

    def counts(self):
        """{source name: {key: (accepted, tried)}} for every key with evidence."""
        out = {}
        for s in range(1, N_SOURCES):
            d = {k: (self.hits[s][k], self.tries[s][k]) for k in range(N_KEYS) if self.tries[s][k] > 0.0}
            if d:
                out[SOURCE_NAMES[s]] = d
        return out

    def record(self, source, int key, int k, int a):
        """Record that ``k`` proposed tokens of ``source`` (name or id) under ``key`` were
        verified and the first ``a`` kept (the loop does this after every pass; for tests
        and what-if runs)."""
        cdef int s = _source_index(source)
        if not (0 < s < N_SOURCES) or not (0 <= key < N_KEYS):
            raise ValueError("unknown source or key")
        if not (k >= 1 and 0 <= a <= k):
            raise ValueError(f"need k >= 1 and 0 <= a <= k, got k={k}, a={a}")
        self.observe(s, key, k, a)

    def rate(self, source, int key=0):
        """Posterior mean acceptance of one proposed token of ``source`` (name or id)."""
        cdef int s = _source_index(source)
        if not (0 < s < N_SOURCES) or not (0 <= key < N_KEYS):
            raise ValueError("unknown source or key")
        return self.mean(s, key)

    cdef inline double prior_hits(self, int s) noexcept nogil:
        return DRAFT_PRIOR_MEAN * DRAFT_PRIOR_N if s == SRC_DRAFT else 1.0

    cdef inline double prior_tries(self, int s) noexcept nogil:
        return DRAFT_PRIOR_N if s == SRC_DRAFT else 2.0

    cdef inline double mean(self, int s, int key) noexcept nogil:
        return (self.hits[s][key] + self.prior_hits(s)) / (self.tries[s][key] + self.prior_tries(s))

    cdef void observe(self, int s, int key, int k, int a) noexcept nogil:
        """k tokens of (s, key) verified, the first a kept: a+1 were tested (fewer if all
        were kept), a of them passed."""
        self.tries[s][key] += a + 1 if a < k else a
        self.hits[s][key] += a

    cdef void fade(self, int s, int key, double f) noexcept nogil:
        self.hits[s][key] *= f
        self.tries[s][key] *= f

    cdef void new_generation(self) noexcept nogil:
        cdef int s, k
        for s in range(N_SOURCES):
            for k in range(N_KEYS):
                self.fade(s, k, 0.5 if s == SRC_DRAFT else FREE_KEEP)
        # how a draft does on one prompt's answer says only so much about the next (chat
        # and code differ widely): at most DRAFT_CARRY_N tokens' worth is carried over, so
        # that one probe on a new prompt can still show that the draft pays there
        for k in range(N_KEYS):
            if self.tries[SRC_DRAFT][k] > DRAFT_CARRY_N:
                self.fade(SRC_DRAFT, k, DRAFT_CARRY_N / self.tries[SRC_DRAFT][k])
        for k in range(N_BUCKETS):
            self.conf_hits[k] *= 0.5
            self.conf_tries[k] *= 0.5
        # the draft's agreement by the target's certainty is the pair's, not a text's:
        # kept whole up to TGAP_KEEP tokens a bucket
        for k in range(N_TGAP):
            if self.tg_tries[k] > TGAP_KEEP:
                self.tg_hits[k] *= TGAP_KEEP / self.tg_tries[k]
                self.tg_tries[k] = TGAP_KEEP
        if self.win_pred > WIN_KEEP:
            self.win_hits *= WIN_KEEP / self.win_pred
            self.win_pred = WIN_KEEP
        for s in range(N_SOURCES):
            self.pred_tok[s] *= 0.5
            self.pred_sec[s] *= 0.5
            self.real_tok[s] *= 0.5
            self.real_sec[s] *= 0.5

    cdef inline int _bucket(self, float conf) noexcept nogil:
        cdef int b = <int>(conf * N_BUCKETS)
        if b >= N_BUCKETS:
            b = N_BUCKETS - 1
        if b < 0:
            b = 0
        return b

    cdef void forget_draft(self, double h, double t) noexcept nogil:
        """Take back h kept of t draft tokens and looks (evidence that turned out to be of
        another draft: one that had not read the text it was asked to copy)."""
        _take_back(&self.hits[SRC_DRAFT][0], &self.tries[SRC_DRAFT][0], h, t)

    cdef void observe_look(self, float conf, bint ok) noexcept nogil:
        """A generated token the draft model was not asked about: it would have proposed
        it (ok) or not, with this confidence."""
        self.tries[SRC_DRAFT][0] += 1.0
        if ok:
            self.hits[SRC_DRAFT][0] += 1.0
        self.observe_conf(conf, ok)

    cdef void observe_conf(self, float conf, bint ok) noexcept nogil:
        cdef int b = self._bucket(conf)
        self.conf_tries[b] += 1.0
        if ok:
            self.conf_hits[b] += 1.0

    cdef inline void observe_tgap(self, int b, bint ok) noexcept nogil:
        """The draft model would have proposed (ok) or not a token the target emitted with
        certainty bucket b (-1: not known)."""
        if 0 <= b < N_TGAP:
            self.tg_tries[b] += 1.0
            if ok:
                self.tg_hits[b] += 1.0

    cdef inline void observe_window(self, int b, bint ok, double unread) noexcept nogil:
        """A draft reading only a window of the prompt, leaving this share of it unread,
        would have proposed (ok) or not a token the target emitted with certainty bucket b
        (not a copy)."""
        if 0 <= b < N_TGAP:
            self.win_pred += self.given_tgap(b) * _win_shape(unread)
            if ok:
                self.win_hits += 1.0

    cdef inline double window_factor(self, double unread) noexcept nogil:
        """A windowed draft's agreement over what the certainty table says (at most 1), for
        a window that leaves this share of the prompt unread."""
        return _clip((self.win_hits + WIN_PRIOR_N * WIN_PRIOR) / (self.win_pred + WIN_PRIOR_N)
                     * _win_shape(unread), 0.0, 1.0)

    def record_windowed(self, gap, bint ok, double unread=0.0):
        """Record that a draft reading only a window of a long prompt (``unread``: the share
        of the prompt it left unread) agreed (ok) or not with a token the target emitted with
        its two best logits ``gap`` apart (for tests and what-if runs; the loop records every
        such drafted token and look)."""
        self.observe_window(_gap_bucket_checked(gap), ok, _share_checked(unread))

    def window_agreement(self, double unread=0.0):
        """How a draft that read only a window of a long prompt, leaving this share of it
        unread, agrees with the target, relative to what its agreement by the target's
        certainty says (1.0: as well)."""
        return self.window_factor(_share_checked(unread))

    cdef inline double given_tgap(self, int b) noexcept nogil:
        """Chance that the draft agrees with a token the target emits with certainty b."""
        return (self.tg_hits[b] + 2.0 * TGAP_PRIOR[b]) / (self.tg_tries[b] + 2.0)

    cdef double tgap_learned(self) noexcept nogil:
        cdef double n = 0.0
        cdef int b
        for b in range(N_TGAP):
            n += self.tg_tries[b]
        return n

    def record_target_gap(self, gap, bint ok):
        """Record that the draft model agreed (ok) or not with a token the target emitted
        when its two best logits were ``gap`` apart (the loop does this for every drafted
        token verified and every token a catch-up looked at; for tests and what-if runs)."""
        self.observe_tgap(_gap_bucket_checked(gap), ok)

    def draft_agreement(self, gap):
        """The draft model's chance to agree with a token the target emits with its two best
        logits ``gap`` apart, as learned so far."""
        return self.given_tgap(_gap_bucket_checked(gap))

    def target_gap_counts(self):
        """[(agreed, tried)] of the draft model by the target's certainty bucket (bucket i:
        gaps from TARGET_GAP_EDGES[i-1] up to TARGET_GAP_EDGES[i])."""
        return [(self.tg_hits[b], self.tg_tries[b]) for b in range(N_TGAP)]

    cdef double given_conf(self, float conf) noexcept nogil:
        """Chance that a drafted token of this confidence is accepted: the confidence as
        a prior, corrected by what was seen."""
        cdef int b = self._bucket(conf)
        return (self.conf_hits[b] + 2.0 * conf) / (self.conf_tries[b] + 2.0)

    cdef double given_prior(self, int s, int key, float conf) noexcept nogil:
        """Chance for one token of a free proposal: the counts of (s, key), with the
        proposer's own confidence (if it gives one) as the prior mean."""
        if conf < 0.0:
            return self.mean(s, key)
        return (self.hits[s][key] + 2.0 * conf) / (self.tries[s][key] + 2.0)


cdef class Policy:
    """Per generation: the cost and acceptance models and the arithmetic above them."""
    cdef CostModel cost
    cdef AcceptanceModel acc
    cdef double tv[MAX_DRAFT + 2]         # this pass's verification time estimates
    cdef double t1                        # target alone: one token per t1 seconds
    cdef double td                        # one draft token
    cdef double corr[N_SOURCES]           # per source: delivered / predicted tokens/s so far
    # what the passes run were predicted to give (stats: predicted vs measured)
    cdef double pred_tokens[N_SOURCES]
    cdef double pred_time[N_SOURCES]
    cdef int64_t n_probes[N_SOURCES]
    cdef int64_t n_offers[N_SOURCES][N_KEYS]   # passes in which (source, key) had a proposal
    # this generation, per source: tokens its verified proposals were predicted to give
    # (at the chances of the carried evidence), tokens they gave, and the factor
    cdef double gen_pred[N_SOURCES]
    cdef double gen_hit[N_SOURCES]
    cdef double calib[N_SOURCES]
    # this generation's tokens by the target's certainty (greedy; see TGAP_SOFT_N)
    cdef double gen_tg[N_TGAP]
    cdef double gen_tg_copy[N_TGAP]       # the same for copies from a prompt the draft skipped
    cdef double gen_copy_hits             # the draft's tokens and looks at such copies (this
    cdef double gen_copy_tries            # generation): evidence of a draft that did not read them
    cdef bint draft_windowed              # the draft reads (or its catch-up would read) a window only
    cdef double draft_unread              # ... leaving this share of the prompt unread

    def __cinit__(self, CostModel cost not None, AcceptanceModel acc not None):
        self.cost = cost
        self.acc = acc
        self.begin()

    cdef void begin(self) noexcept:
        memset(self.pred_tokens, 0, sizeof(self.pred_tokens))
        memset(self.pred_time, 0, sizeof(self.pred_time))
        memset(self.n_probes, 0, sizeof(self.n_probes))
        memset(self.n_offers, 0, sizeof(self.n_offers))
        memset(self.gen_pred, 0, sizeof(self.gen_pred))
        memset(self.gen_hit, 0, sizeof(self.gen_hit))
        memset(self.gen_tg, 0, sizeof(self.gen_tg))
        memset(self.gen_tg_copy, 0, sizeof(self.gen_tg_copy))
        self.gen_copy_hits = 0.0
        self.gen_copy_tries = 0.0
        self.draft_windowed = False
        self.draft_unread = 0.0
        cdef int s
        for s in range(N_SOURCES):
            self.calib[s] = 1.0
        self.refresh()

    cdef void refresh(self) noexcept nogil:
        """Read the cost model's current estimates (once per pass)."""
        cdef int n
        for n in range(1, MAX_DRAFT + 2):
            self.tv[n] = self.cost.t_verify(n)
        self.t1 = self.tv[1]
        self.td = self.cost.t_draft()
        if self.td <= 0.0:
            self.td = 0.3 * self.t1
        for n in range(N_SOURCES):
            # costs held as given (what-if runs, tests): take the predictions as they are
            self.corr[n] = 1.0 if self.cost.hold else self.acc.correction(n, self.t1)

    cdef inline void count_offer(self, int s, int key) noexcept nogil:
        self.n_offers[s][key] += 1

    cdef inline double offers(self, int s, int key) noexcept nogil:
        return <double>self.n_offers[s][key]

    cdef inline void count_probe(self, int s) noexcept nogil:
        self.n_probes[s] += 1

    cdef inline double chance(self, int s, int key, float conf) noexcept nogil:
        """Chance that one token of a free proposal (after the ones before it were kept)
        is kept: the carried evidence, scaled by this generation's calibration."""
        return self.acc.given_prior(s, key, conf) * self.calib[s]

    cdef void observe_free(self, int s, int key, const float * conf, int k, int a) noexcept nogil:
        """k tokens of a free proposal of (s, key) were verified, the first a kept: this
        generation's calibration (against the prediction made), then the acceptance counts."""
        cdef int j, n = a + 1 if a < k else a
        for j in range(n):
            self.gen_pred[s] += self.acc.given_prior(s, key, conf[j])
        self.gen_hit[s] += a
        self._calibrate(s)
        self.acc.observe(s, key, k, a)

    cdef inline void _calibrate(self, int s) noexcept nogil:
        self.calib[s] = (self.gen_hit[s] + CALIB_N) / (self.gen_pred[s] + CALIB_N)
        if self.calib[s] > 1.0:
            self.calib[s] = 1.0

    cdef inline double draft_chance(self, float conf) noexcept nogil:
        """Chance that a drafted token of this confidence is kept: the draft's carried
        calibration by confidence, scaled by this generation's."""
        return self.acc.given_conf(conf) * self.calib[SRC_DRAFT]

    cdef inline void _calibrate_draft(self, float conf, bint ok) noexcept nogil:
        self.gen_pred[SRC_DRAFT] += self.acc.given_conf(conf)
        self.gen_hit[SRC_DRAFT] += 1.0 if ok else 0.0
        self._calibrate(SRC_DRAFT)

    cdef void observe_draft_token(self, float conf, bint ok, int tgap) noexcept nogil:
        """A drafted token of this confidence was verified: kept (ok) or not; the target's
        certainty there was bucket tgap (-1: not known)."""
        self._calibrate_draft(conf, ok)
        self.acc.observe_conf(conf, ok)
        self._observe_tgap(tgap, ok)

    cdef inline void _note_copy_try(self, int tgap, bint ok) noexcept nogil:
        if tgap == TGAP_COPY:
            self.gen_copy_tries += 1.0
            if ok:
                self.gen_copy_hits += 1.0

    cdef void observe_look(self, float conf, bint ok, int tgap) noexcept nogil:
        """A generated token the draft model was not asked about (a catch-up's look): it
        would have proposed it (ok) or not, with this confidence; the target had emitted
        it with certainty bucket tgap (-1: not known)."""
        self._calibrate_draft(conf, ok)
        self.acc.observe_look(conf, ok)
        self._observe_tgap(tgap, ok)

    cdef inline void _observe_tgap(self, int tgap, bint ok) noexcept nogil:
        """What a drafted token or look at certainty bucket tgap teaches: the table, or for
        a draft reading only a window, its factor against the table."""
        if self.draft_windowed:
            self.acc.observe_window(tgap, ok, self.draft_unread)
        else:
            self.acc.observe_tgap(tgap, ok)
        self._note_copy_try(tgap, ok)

    cdef inline void note_target_token(self, int tgap) noexcept nogil:
        """The target emitted a token of this generation with certainty bucket tgap."""
        if 0 <= tgap < N_TGAP:
            self.gen_tg[tgap] += 1.0

    cdef inline void note_copy_token(self, int tgap) noexcept nogil:
        """The target emitted a copy from the part of the prompt a windowed draft skipped,
        with certainty bucket tgap: evidence of the draft only if it reads that part."""
        if 0 <= tgap < N_TGAP:
            self.gen_tg_copy[tgap] += 1.0

    cdef void copies_read(self) noexcept nogil:
        """The draft model has read all of the prompt: this generation's copies are
        evidence of it like any other token, and what it did at them before, not having
        read their source, is no evidence of it any more (nor is this generation's
        calibration, made mostly there)."""
        cdef int b
        for b in range(N_TGAP):
            self.gen_tg[b] += self.gen_tg_copy[b]
            self.gen_tg_copy[b] = 0.0
        self.acc.forget_draft(self.gen_copy_hits, self.gen_copy_tries)
        self.gen_copy_hits = 0.0
        self.gen_copy_tries = 0.0
        self.gen_pred[SRC_DRAFT] = 0.0
        self.gen_hit[SRC_DRAFT] = 0.0
        self.calib[SRC_DRAFT] = 1.0

    cdef double draft_mean_reading_all(self) noexcept nogil:
        """The draft's acceptance mean were it to read all of the prompt (copies count)."""
        cdef double A, B
        self.draft_evidence(&A, &B, True)
        return A / (A + B)

    cdef void draft_evidence(self, double * A, double * B, bint with_copies=False) noexcept nogil:
        """The draft model's acceptance posterior, Beta(A, B): its prior, the evidence
        carried and seen (drafted tokens, looks), and what the target's certainty on this
        generation's tokens says of it (see TGAP_SOFT_N), for a draft reading only a window
        of the prompt scaled by the window's factor (WIN_PRIOR); ``with_copies``: as if it
        read all of the prompt (copies from the part it skipped count too, no factor)."""
        cdef double h = self.acc.hits[SRC_DRAFT][0], t = self.acc.tries[SRC_DRAFT][0]
        cdef double n = 0.0, m = 0.0, w, pm, pn
        cdef int b
        cdef double c, f = 1.0
        if self.draft_windowed and not with_copies:
            f = self.acc.window_factor(self.draft_unread)
        if with_copies:
            # what the draft did at copies whose source it had not read says nothing of it
            # once it has
            _take_back(&h, &t, self.gen_copy_hits, self.gen_copy_tries)
        A[0] = h + self.acc.prior_hits(SRC_DRAFT)
        B[0] = t - h + self.acc.prior_tries(SRC_DRAFT) - self.acc.prior_hits(SRC_DRAFT)
        for b in range(N_TGAP):
            c = self.gen_tg[b] + (self.gen_tg_copy[b] if with_copies else 0.0)
            n += c
            m += c * self.acc.given_tgap(b)
        if n <= 0.0:
            return
        m = f * m / n
        if n > TGAP_SOFT_N:
            n = TGAP_SOFT_N
        w = n * (0.5 + 0.5 * _clip(self.acc.tgap_learned() / TGAP_TRUST, 0.0, 1.0))
        # the prior's mean moves there too, as this generation's tokens come: what is
        # expected of the draft here before it was seen
        pm = DRAFT_PRIOR_MEAN + (m - DRAFT_PRIOR_MEAN) * n / TGAP_SOFT_N
        pn = self.acc.prior_tries(SRC_DRAFT)
        A[0] = h + pn * pm + w * m
        B[0] = t - h + pn * (1.0 - pm) + w * (1.0 - m)

    cdef double draft_mean(self) noexcept nogil:
        cdef double A, B
        self.draft_evidence(&A, &B)
        return A / (A + B)

    cdef inline void predict(self, int source, double e, double secs) noexcept nogil:
        self.pred_tokens[source] += e
        self.pred_time[source] += secs

    # -- rates ------------------------------------------------------------------------
    cdef inline bint draft_start_pays(self, double r, double best, int n_read) noexcept nogil:
        """Whether the draft, promising ``r`` tokens/s (its catch-up of n_read tokens counted),
        is worth running against the best other choice's ``best``: by the rate alone for a
        routine catch-up, by DRAFT_START_EDGE more where it starts on a long read."""
        return r > best * (DRAFT_START_EDGE if n_read > CATCHUP_SMALL else 1.0)

    def start_pays(self, double rate, double best, int n_read):
        """Whether a draft promising ``rate`` tokens/s, its catch-up of ``n_read`` tokens
        counted, is run against ``best`` (see DRAFT_START_EDGE_FACTOR)."""
        if rate < 0.0 or best < 0.0 or n_read < 0:
            raise ValueError("rate, best and n_read must be >= 0")
        return self.draft_start_pays(rate, best, n_read)

    cdef double best_const(self, double a, int n, double t_fixed, double t_per, int * k_out) noexcept nogil:
        """Best tokens/s over k = 1..n for a proposal whose tokens are each accepted with
        chance a, costing t_fixed + k t_per to propose.  k_out: that k."""
        cdef double e = 1.0, p = 1.0, r, best = 0.0
        cdef int k
        k_out[0] = 0
        for k in range(1, n + 1):
            p *= a
            e += p
            r = e / (t_fixed + k * t_per + self.tv[k + 1])
            if r > best:
                best = r
                k_out[0] = k
        return best

    cdef double free_choice(self, int s, int key, const float * conf, int n, int * k_out, double * e_out) noexcept nogil:
        """Best tokens/s of verifying k = 1..n tokens of a free proposal (k_out, and its
        expected tokens e_out); 0 if none."""
        cdef double e = 1.0, p = 1.0, r, best = 0.0
        cdef int k
        k_out[0] = 0
        e_out[0] = 1.0
        for k in range(1, n + 1):
            p *= self.chance(s, key, conf[k - 1])
            e += p
            r = e / self.tv[k + 1]
            if r > best:
                best = r
                k_out[0] = k
                e_out[0] = e
        return best

    cdef double expect_free(self, int s, int key, const float * conf, int k) noexcept nogil:
        """Expected tokens of a pass verifying the first k tokens of a free proposal."""
        cdef double e = 1.0, p = 1.0
        cdef int j
        for j in range(k):
            p *= self.chance(s, key, conf[j])
            e += p
        return e

    cdef double draft_fixed(self, int n_behind) noexcept nogil:
        """Draft time beyond one decode per drafted token: catching up with n_behind
        tokens it has not seen (1 = just the pending token)."""
        if n_behind <= 1:
            return 0.0
        return (n_behind - 1) * self.cost.t_catchup_cost(n_behind)

    # -- probing ------------------------------------------------------------------------
    cdef bint worth_probe(self, int s, int key, int n, double t_fixed, double t_per, double future,
                          int n_look, int * k_out) noexcept nogil:
        # t_fixed (catching up) is paid by the probe alone; the passes after it are in step
        """Is trying (s, key) once, though its mean acceptance does not pay, worth it?
        Value: E[max(0, seconds saved per token)] over the acceptance posterior, times
        ``future`` tokens it could serve, times the share of the posterior one probe of
        k tokens (and the n_look tokens of evidence its catch-up brings) adds.  Cost: the
        time the probe loses at the mean acceptance.  Both at the proposer's realized
        correction and margin (DRAFT_MARGIN for the draft model), as when it is chosen on
        its mean."""
        cdef double h = self.acc.hits[s][key], t = self.acc.tries[s][key], A, B
        if s == SRC_DRAFT:
            self.draft_evidence(&A, &B)
        else:
            A = h + self.acc.prior_hits(s)
            B = t - h + self.acc.prior_tries(s) - self.acc.prior_hits(s)
        if self.calib[s] < 1.0 and s != SRC_DRAFT:
            # what this generation showed of a free proposer moves the posterior's mean too
            # (the draft's counts are this generation's already: little is carried over)
            B += A * (1.0 - self.calib[s])
            A *= self.calib[s]
        cdef double mean = A / (A + B), sd = sqrt(A * B / ((A + B) * (A + B) * (A + B + 1.0)))
        cdef double a, lw, wmax = -1e300, wsum = 0.0, gain = 0.0, r, g, e, p, cost_probe
        cdef double lws[N_GRID]
        cdef double margin, corr = self.corr[s], ev, net, best_net
        cdef int i, k, kk, best_k
        if n <= 0 or future <= 0.0 or self.t1 <= 0.0 or corr <= 0.0:
            return False
        # as where the proposer is chosen on its mean: its rates scaled by what its passes
        # really took against the prediction (a probe must not run what that sets aside)
        margin = (DRAFT_MARGIN if s == SRC_DRAFT else 1.0) / corr
        # the upper bound: if even certain acceptance cannot pay, never probe
        if self.best_const(1.0, n, 0.0, t_per, &k) * self.t1 <= margin:
            return False
        for i in range(N_GRID):
            a = (i + 0.5) / N_GRID
            lws[i] = (A - 1.0) * log(a) + (B - 1.0) * log(1.0 - a)
            if lws[i] > wmax:
                wmax = lws[i]
        for i in range(N_GRID):
            a = (i + 0.5) / N_GRID
            lw = exp(lws[i] - wmax)
            wsum += lw
            r = self.best_const(a, n, 0.0, t_per, &kk) / margin
            if r > 0.0:
                g = self.t1 - 1.0 / r
                if g > 0.0:
                    gain += lw * g
        gain /= wsum
        # probe length: at most what would be used if acceptance were optimistic
        a = mean + 1.3 * sd
        if a > 0.99:
            a = 0.99
        self.best_const(a, n, 0.0, t_per, &k)
        if k < 1:
            k = 1
        if s == SRC_DRAFT:
            e = 1.0
            p = 1.0
            for i in range(k):
                p *= mean
                e += p
            # the pass at the margin the proposer is held to when chosen on its mean (a draft
            # pass costs more than the model says, and its acceptance is over-promised)
            cost_probe = t_fixed + (k * t_per + self.tv[k + 1]) * margin - e * self.t1
            k_out[0] = k
            return gain * future * (k + n_look) / (A + B + k + n_look) > cost_probe
        # a free proposal's tokens are evidence only up to its first miss (observe()): a probe
        # of k tokens brings 1 + mean + ... + mean^(k-1) tries, not k, while its pass grows
        # with k; the length with the best value less cost, if any is positive
        ev = 0.0
        best_net = -1e300
        best_k = 1
        e = 1.0
        p = 1.0
        for kk in range(1, k + 1):
            ev += p                 # mean^(kk-1): the kk-th token is tested if all before passed
            p *= mean
            e += p
            net = (gain * future * (ev + n_look) / (A + B + ev + n_look)
                   - (t_fixed + (kk * t_per + self.tv[kk + 1]) * margin - e * self.t1))
            if net > best_net:
                best_net = net
                best_k = kk
        k_out[0] = best_k
        return best_net > 0.0

    # -- drafting, token by token ----------------------------------------------------
    cdef int draft_decision(self, int j, int cap, float conf, double spent, double * p_all,
                            double * e_sum) noexcept nogil:
        """Drafted token j (0-based) has confidence ``conf``, after ``spent`` seconds of
        drafting.  0 = drop it and stop, 1 = keep it and stop, 2 = keep it and draft on.
        Tokens not drafted yet are assumed as likely as this one (the draft's confidence
        runs in streaks)."""
        cdef double acc = self.draft_chance(conf)
        cdef double p_j = p_all[0] * acc
        cdef double r_drop = e_sum[0] / (spent + self.tv[j + 1])
        cdef double r_keep = (e_sum[0] + p_j) / (spent + self.tv[j + 2])
        cdef double r_more = 0.0, e = e_sum[0] + p_j, p = p_j, r
        cdef int m
        for m in range(1, cap - j):
            p *= acc
            e += p
            r = e / (spent + m * self.td + self.tv[j + 2 + m])
            if r > r_more:
                r_more = r
        p_all[0] = p_j
        e_sum[0] = e_sum[0] + p_j
        if r_drop >= r_keep and r_drop >= r_more:
            return 0
        if r_keep >= r_more:
            return 1
        return 2

    # -- from Python ----------------------------------------------------------------
    cdef int _free_source(self, source) except -1:
        cdef int s = _source_index(source)
        if not (0 < s < N_SOURCES) or s == SRC_DRAFT:
            raise ValueError(f"not a free proposer's source: {source!r}")
        return s

    cdef float * _confs(self, confs, int * n) except NULL:
        n[0] = len(confs)
        if not (1 <= n[0] <= MAX_DRAFT):
            raise ValueError(f"need 1..{MAX_DRAFT} confidences, got {n[0]}")
        cdef float * c = <float *>malloc(n[0] * sizeof(float))
        if c == NULL:
            raise MemoryError()
        try:
            for i, v in enumerate(confs):
                c[i] = <float>v
        except BaseException:
            free(c)
            raise
        return c

    def choose_free(self, source, int key, confs):
        """What this pass would verify of a free proposal of ``source`` under ``key``
        whose tokens have confidences ``confs``: (k, expected tokens, tokens per second);
        k = 0 where no length beats the target alone."""
        cdef int s = self._free_source(source), n, k
        cdef double e, r
        if not (0 <= key < N_KEYS):
            raise ValueError("unknown key")
        cdef float * c = self._confs(confs, &n)
        self.refresh()
        r = self.free_choice(s, key, c, n, &k, &e) * self.corr[s]
        free(c)
        if r * self.t1 <= 1.0:
            return (0, 1.0, 1.0 / self.t1)
        return (k, e, r)

    def probe_free(self, source, int key, int n, double future):
        """Whether a free proposal of ``source`` under ``key``, n tokens long, that does
        not pay on its mean acceptance is worth trying once anyway, with ``future`` tokens
        it could serve: (worth it, how many of its tokens to verify)."""
        cdef int s = self._free_source(source), k = 0
        cdef bint ok
        if not (0 <= key < N_KEYS):
            raise ValueError("unknown key")
        if n < 1 or n > MAX_DRAFT:
            raise ValueError(f"n must be between 1 and {MAX_DRAFT}")
        if not future >= 0.0:
            raise ValueError("future must be >= 0")
        self.refresh()
        ok = self.worth_probe(s, key, n, 0.0, 0.0, future, 0, &k)
        return (bool(ok), k if ok else 0)

    def record_free(self, source, int key, confs, int a):
        """Record that a free proposal (its tokens' confidences ``confs``) was verified
        whole and its first ``a`` tokens kept, as the loop does after such a pass (this
        generation's calibration, then the acceptance model)."""
        cdef int s = self._free_source(source), n
        if not (0 <= key < N_KEYS):
            raise ValueError("unknown key")
        cdef float * c = self._confs(confs, &n)
        if not (0 <= a <= n):
            free(c)
            raise ValueError(f"need 0 <= a <= {n}, got {a}")
        self.observe_free(s, key, c, n, a)
        free(c)

    def record_draft(self, double conf, bint ok, gap=None):
        """Record that a drafted token of confidence ``conf`` was verified and kept (ok)
        or not, as the loop does (this generation's calibration, then the acceptance
        model's by confidence; with ``gap``, the target's two best logits there that far
        apart, the same by the target's certainty)."""
        if not (0.0 <= conf <= 1.0):
            raise ValueError(f"conf must be in [0, 1], got {conf}")
        cdef int b = -1 if gap is None else _gap_bucket_checked(gap)
        self.observe_draft_token(<float>conf, ok, b)

    def draft_token_chance(self, double conf):
        """Chance that a drafted token of confidence ``conf`` is kept, as the policy
        reckons it now."""
        if not (0.0 <= conf <= 1.0):
            raise ValueError(f"conf must be in [0, 1], got {conf}")
        return self.draft_chance(<float>conf)

    def record_target_token(self, gap):
        """Record that the target emitted a token of this generation with its two best
        logits ``gap`` apart (greedy; the loop does this for every token it emits while a
        draft model is in play)."""
        self.note_target_token(_gap_bucket_checked(gap))

    def draft_rate(self):
        """The draft model's acceptance as the policy reckons it now for this generation
        (what it is chosen on): carried and seen evidence, and the target's certainty."""
        return self.draft_mean()

    def calibration(self, source):
        """This generation's factor on ``source``'s chances (1.0: it gave what it was
        predicted to, or more)."""
        cdef int s = _source_index(source)
        if not (0 < s < N_SOURCES):
            raise ValueError(f"unknown source: {source!r}")
        return self.calib[s]

    def predicted(self):
        """(tokens, seconds) the policy expected of the passes it ran, per source name."""
        return {SOURCE_NAMES[s]: (self.pred_tokens[s], self.pred_time[s]) for s in range(N_SOURCES)}
