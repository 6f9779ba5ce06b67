"""Statistics of one generation, and the speed-up theory predicts for them."""
from __future__ import annotations

from dataclasses import dataclass, field, asdict


def leviathan_speedup(alpha: float, gamma: float, c: float) -> float:
    """Expected wall-time speed-up of speculative decoding (Leviathan et al. 2023):
    S = (1 - alpha^(gamma+1)) / ((1 - alpha) (gamma c + 1)), for per-token acceptance
    ``alpha``, ``gamma`` tokens drafted per target pass and draft/target cost ratio ``c``.
    It assumes verifying gamma+1 tokens costs one target step."""
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        expected = gamma + 1.0
    else:
        expected = (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)
    return expected / (gamma * c + 1.0)


@dataclass
class GenerationStats:
    n_generated: int                 # tokens emitted
    n_drafted: int                   # tokens proposed (draft model + lookup)
    n_accepted: int                  # proposals the target accepted
    n_target_passes: int             # batched target decodes (one per step)
    acceptance_rate: float           # n_accepted / n_drafted
    alpha: float                     # per-token acceptance estimate: accepted / (accepted + rejections)
    mean_accepted_length: float      # tokens emitted per target pass (1.0 without speculation)
    acceptance_by_position: list     # for draft position i: accepted / drafted at i
    drafted_by_source: dict
    accepted_by_source: dict
    emitted_by_source: dict
    t_prefill: float                 # seconds: the target reading the prompt
    t_draft: float                   # the draft model's decodes, its reading of the prompt included
    t_verify: float
    t_generate: float                # draft + verify, excluding prefill
    t_calibrate: float               # one-time timing of batch sizes (first adaptive run of a decoder)
    tokens_per_second: float         # n_generated / t_generate
    cost_ratio: float | None         # c: one draft token / one single-token target pass
    theoretical_speedup: float | None  # Leviathan bound for the measured alpha, gamma and c
    # the policy's expectation (from the cost model and the acceptance it had learned) for
    # the passes it ran, next to tokens_per_second, and for the target alone (None if unknown)
    predicted_tokens_per_second: float | None = None
    predicted_target_tokens_per_second: float | None = None
    passes_by_source: dict = field(default_factory=dict)   # target passes by what they verified
    passes_by_size: dict = field(default_factory=dict)     # {n: target passes that decoded n tokens}
    probes_by_source: dict = field(default_factory=dict)   # passes run to learn a proposer's acceptance
    # generate(trace=True): one dict a target pass, as the policy saw it (Generator.trace);
    # None otherwise
    trace: list | None = field(default=None, repr=False)
    raw: dict = field(repr=False, default_factory=dict)

    @classmethod
    def from_core(cls, d: dict) -> "GenerationStats":
        drafted, accepted, passes = d["n_drafted"], d["n_accepted"], d["n_passes"]
        tested = accepted + d["n_rejected"]
        alpha = accepted / tested if tested else 0.0
        by_pos = [a / n if n else 0.0 for a, n in zip(d["accepted_by_pos"], d["drafted_by_pos"])]
        while by_pos and d["drafted_by_pos"][len(by_pos) - 1] == 0:
            by_pos.pop()
        t_gen = d["t_generate"]
        t_target_1 = d["t_verify_est"].get(1) or d["t_target_token_est"] or None
        t_draft_1 = d["t_draft_token_est"] or None
        c = t_draft_1 / t_target_1 if (t_draft_1 and t_target_1) else None
        gamma = drafted / passes if passes else 0.0
        bound = leviathan_speedup(alpha, gamma, c) if (c is not None and drafted) else None
        return cls(
            n_generated=d["n_generated"], n_drafted=drafted, n_accepted=accepted, n_target_passes=passes,
            acceptance_rate=accepted / drafted if drafted else 0.0, alpha=alpha,
            # the end-of-generation token counts as emitted here: it came from a pass
            mean_accepted_length=(d["n_generated"] + d["n_eog"]) / passes if passes else 0.0,
            acceptance_by_position=by_pos,
            drafted_by_source=d["drafted_by_source"], accepted_by_source=d["accepted_by_source"],
            emitted_by_source=d["emitted_by_source"],
            t_prefill=d["t_prefill"], t_draft=d["t_draft"], t_verify=d["t_verify"], t_generate=t_gen,
            t_calibrate=d["t_calibrate"],
            tokens_per_second=d["n_generated"] / t_gen if t_gen > 0 else 0.0,
            cost_ratio=c, theoretical_speedup=bound,
            predicted_tokens_per_second=d.get("predicted_tokens_per_second") or None,
            predicted_target_tokens_per_second=d.get("predicted_target_tokens_per_second") or None,
            passes_by_source=d.get("passes_by_source", {}), probes_by_source=d.get("probes_by_source", {}),
            passes_by_size=dict(d.get("passes_by_size", {})),
            trace=d.get("trace"),
            raw=d,
        )

    def explain(self) -> str:
        """The pass trace as a table (``generate(..., trace=True)``): each pass's choice,
        what the policy promised for it and for the target alone, what it expected and what
        came of it; for the draft model, the acceptance it was reckoned at, the tokens it
        read first and the answer's length its reading was spread over."""
        if self.trace is None:
            raise ValueError("no trace: generate with trace=True")
        lines = ["pass    at  verified     k kept  emitted  expected     took   promised tok/s "
                 "(alone)  draft: acceptance read length"]
        for i, p in enumerate(self.trace, 1):
            what = p["source"] + ("?" if p["probe"] else "")
            draft = ""
            if p["draft_acceptance"] > 0:        # weighed (a promise of 0: no length paid)
                draft = (f"  {p['draft_rate']:6.1f} tok/s at {p['draft_acceptance']:.2f}, "
                         f"read {p['draft_read']}{' (all)' if p['draft_read_all'] else ''}, "
                         f"~{p['draft_future']:.0f} tokens")
            lines.append(f"{i:4d} {p['at']:5d}  {what:10s} {p['k']:3d} {p['accepted'] if p['k'] else '-':>4} "
                         f"{p['emitted']:8d} {p['expected_tokens']:5.2f} in {p['expected_seconds'] * 1e3:5.1f} ms "
                         f"{p['seconds'] * 1e3:6.1f} ms {p['best_rate']:8.1f} ({p['target_rate']:6.1f}){draft}")
        lines.append("(? a probe: run to learn a proposer's acceptance, not because it promised more)")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("raw")
        return out
