"""Generation settings: one place for their defaults, limits and checks, shared by
``SpeculativeDecoder.generate``/``stream``/``chat`` and handed to the compiled loop.

The limits come from the compiled core, which enforces them too.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from . import _core

MAX_DRAFT: int = _core.DRAFT_LIMIT            # most tokens proposed per target pass
AUTO_DRAFT_MAX: int = 16                      # the most n_draft="auto" proposes per pass
NGRAM_LIMIT: int = _core.NGRAM_LIMIT          # longest n-gram lookup matches
NGRAM_MIN: int = _core.NGRAM_MIN_DEFAULT      # default shortest n-gram lookup matches
NGRAM_MAX: int = _core.NGRAM_MAX_DEFAULT      # default longest n-gram lookup matches

__all__ = ["GenerationConfig", "MAX_DRAFT", "AUTO_DRAFT_MAX", "NGRAM_LIMIT", "NGRAM_MIN", "NGRAM_MAX"]


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass(frozen=True)
class GenerationConfig:
    """Everything one generation is asked to do.  Checked on construction: bad values
    raise ``ValueError``/``TypeError`` with the setting's name."""
    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple | str | None = None      # normalised to a tuple of strings
    n_draft: int | str = "auto"
    n_draft_min: int = 0
    p_min: float = 0.0
    lookup: bool = False
    ngram_min: int = NGRAM_MIN
    ngram_max: int = NGRAM_MAX
    speculative: bool = True
    add_special: bool = True
    prediction: str | tuple | None = None  # the expected output: text, or token ids (a tuple)
    suffix: bool = True                  # use the decoder's suffix corpus, if it has one
    trace: bool = False                  # record every pass's choice in stats.trace

    def __post_init__(self):
        t = self.temperature
        if not _is_number(t) or math.isnan(t) or t < 0:
            raise ValueError(f"temperature must be a number >= 0, got {t!r}")
        if math.isinf(t):
            raise ValueError("temperature must be finite")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not _is_number(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_number(self.min_p) or not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        nd = self.n_draft
        if nd != "auto":
            if not _is_int(nd):
                raise ValueError(f"n_draft must be an integer or 'auto', got {nd!r}")
            if not (1 <= nd <= MAX_DRAFT):
                raise ValueError(f"n_draft must be between 1 and {MAX_DRAFT}, got {nd}")
        if not _is_int(self.n_draft_min) or self.n_draft_min < 0:
            raise ValueError(f"n_draft_min must be an integer >= 0, got {self.n_draft_min!r}")
        if not _is_number(self.p_min) or not (0.0 <= self.p_min <= 1.0):
            raise ValueError(f"p_min must be in [0, 1], got {self.p_min!r}")
        for name in ("ngram_min", "ngram_max"):
            if not _is_int(getattr(self, name)):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if not (1 <= self.ngram_min <= self.ngram_max <= NGRAM_LIMIT):
            raise ValueError(f"need 1 <= ngram_min <= ngram_max <= {NGRAM_LIMIT}, "
                             f"got ngram_min={self.ngram_min}, ngram_max={self.ngram_max}")
        stop = self.stop
        if stop is None:
            stop = ()
        elif isinstance(stop, str):
            stop = (stop,)
        else:
            try:
                stop = tuple(stop)
            except TypeError:
                raise TypeError(f"stop must be a string or a sequence of strings, got {stop!r}") from None
        if not all(isinstance(s, str) for s in stop):
            raise TypeError("stop must be a string or a sequence of strings")
        object.__setattr__(self, "stop", stop)
        pred = self.prediction
        if pred is not None:
            if isinstance(pred, str):
                if not pred:
                    raise ValueError("prediction is empty: pass the expected output, or None")
            elif isinstance(pred, (bytes, bytearray)):
                raise TypeError("prediction must be text (str) or a list of token ids, not bytes")
            else:
                try:
                    pred = tuple(pred)
                except TypeError:
                    raise TypeError("prediction must be text (str) or a list of token ids, "
                                    f"got {type(self.prediction).__name__}") from None
                if not pred:
                    raise ValueError("prediction is empty: pass the expected output, or None")
                bad = next((v for v in pred if not _is_int(v)), None)
                if bad is not None:
                    raise TypeError(f"prediction token ids must be integers, got {bad!r}")
            object.__setattr__(self, "prediction", pred)
        for name in ("lookup", "speculative", "add_special", "suffix", "trace"):
            object.__setattr__(self, name, bool(getattr(self, name)))

    @classmethod
    def from_kwargs(cls, **kwargs) -> "GenerationConfig":
        """From keyword arguments; an unknown name raises ``TypeError``."""
        names = {f.name for f in fields(cls)}
        unknown = set(kwargs) - names
        if unknown:
            raise TypeError(f"unexpected arguments: {', '.join(sorted(unknown))}")
        return cls(**kwargs)

    @property
    def adaptive(self) -> bool:
        return self.n_draft == "auto"

    def to_dict(self) -> dict:
        return asdict(self)
