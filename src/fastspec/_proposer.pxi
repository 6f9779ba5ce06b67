# Proposers: whatever suggests the tokens the target verifies in a pass.  Included into
# _core.pyx before the proposer implementations (_lookup.pxi, _draft.pxi, ...) and the
# loop (_engine.pxi).
#
# Token provenance ("source") is one small int, fixed order, defined here once:
# SOURCE_NAMES[source] is its name in stats, stream pieces and results.
#
# A proposer is a Proposer subclass.  Free proposers (lookup, prediction, suffix: no
# model runs) implement begin/extend/propose/feedback and nothing else; the policy
# (_policy.pxi) decides each pass whether to verify a proposal and how many of its
# tokens, from the measured verification costs and the acceptance it has learned per
# (source, key).  The draft model is the one costly proposer (a model decode per
# token); it has its own drafting entry points (_draft.pxi).
#
# A new proposer = one new .pxi file with one Proposer subclass whose ``source`` is a
# new id (append it to SOURCE_NAMES and the enum below) + one registration: an
# ``include`` line in _core.pyx, and its construction where fastspec.api builds the
# list of free proposers handed to the Generator (``proposers=[...]``).

cdef enum:
    SRC_TARGET = 0
    SRC_DRAFT = 1
    SRC_LOOKUP = 2
    SRC_PREDICTION = 3
    SRC_SUFFIX = 4
    N_SOURCES = 5          # len(SOURCE_NAMES)
    N_KEYS = 16            # proposal-quality keys per source: 0 .. N_KEYS-1
    MAX_DRAFT = 32         # most tokens verified with one target pass, minus one
    MAX_PROPOSAL = 32      # = MAX_DRAFT: most tokens one proposal may hold

SOURCE_NAMES = ("target", "draft", "lookup", "prediction", "suffix")


cdef class Proposer:
    """Base class of everything that proposes tokens for the target to verify.

    Subclasses set ``self.source`` (an id of SOURCE_NAMES) in their ``__cinit__`` and
    override the four cdef methods below.  Only the draft model sets ``costly``.
    A proposer object belongs to one Generator at a time (the loop calls it without
    the GIL, one call at a time)."""
    cdef readonly int source            # one of the source ids above
    cdef bint costly                    # True only for the draft model

    def __cinit__(self, *args, **kwargs):
        self.source = SRC_TARGET
        self.costly = False

    cdef int begin(self, const ll.llama_token * seq, int n_prompt) except -1:
        """A new generation starts: seq[0:n_prompt] is the prompt.  Called with the GIL
        (may raise, e.g. MemoryError)."""
        return 0

    cdef void extend(self, const ll.llama_token * seq, int seq_len) noexcept nogil:
        """The sequence grew: seq[0:seq_len] is every token so far (prompt + emitted).
        Called after every target pass that emitted tokens (so after rejections too)."""
        pass

    cdef int propose(self, const ll.llama_token * seq, int seq_len, int cap,
                     ll.llama_token * out, float * conf, int * key) noexcept nogil:
        """Propose up to ``cap`` tokens continuing seq[0:seq_len] into out[0:n]; for each,
        conf[j] = own estimate in [0, 1] that token j is right given tokens < j are (or
        -1.0 for none); key[0] = a match-quality bucket in [0, N_KEYS) under which the
        policy learns this proposer's acceptance.  Returns n (0 = nothing).  Must be cheap
        (microseconds)."""
        return 0

    cdef void feedback(self, int n_verified, int n_accepted) noexcept nogil:
        """This proposer's last proposal was verified: n_verified of its tokens went to
        the target, n_accepted of them were kept."""
        pass

    # -- from Python (tests, tools) ---------------------------------------------------
    @property
    def name(self):
        return SOURCE_NAMES[self.source]

    def feedback_for(self, int n_verified, int n_accepted):
        """Test helper: tell the proposer its last proposal was verified (feedback())."""
        if not (0 <= n_accepted <= n_verified):
            raise ValueError("need 0 <= n_accepted <= n_verified")
        self.feedback(n_verified, n_accepted)

    def propose_for(self, tokens, int cap=MAX_PROPOSAL, *, bint restart=True):
        """Test helper: begin() with ``tokens`` as the prompt (``restart=False``: extend()
        to them instead, as after a target pass), then propose up to ``cap`` tokens
        continuing them.  Returns (tokens, confidences, key)."""
        cdef int n = len(tokens), i, m, key = 0
        if n < 1:
            raise ValueError("need at least one token")
        if not (1 <= cap <= MAX_PROPOSAL):
            raise ValueError(f"cap must be in 1..{MAX_PROPOSAL}")
        cdef ll.llama_token * seq = <ll.llama_token *>malloc(n * sizeof(ll.llama_token))
        cdef ll.llama_token out[MAX_PROPOSAL]
        cdef float conf[MAX_PROPOSAL]
        if seq == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                seq[i] = tokens[i]
            if restart:
                self.begin(seq, n)
            else:
                with nogil:
                    self.extend(seq, n)
            with nogil:
                m = self.propose(seq, n, cap, out, conf, &key)
            return [out[i] for i in range(m)], [conf[i] for i in range(m)], key
        finally:
            free(seq)
