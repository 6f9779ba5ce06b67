"""Benchmark prompts: the built-in set (package data ``bench_prompts.jsonl``) and JSON-lines
files, plain ``{"prompt", "category", "id", "prediction"}`` or Spec-Bench's ``{"question_id",
"category", "turns"}``; selection by category and count."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path


class BenchError(Exception):
    """Bad input: reported as one line on stderr, with exit code ``code``."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code



@dataclass
class Prompt:
    id: str
    category: str
    text: str
    turns: list = field(default_factory=list)   # every turn (Spec-Bench); [text] otherwise
    prediction: str | None = None                # the expected output (code edits), if any


# -- prompts -----------------------------------------------------------------
def parse_prompt_line(line: str, lineno: int, source: str) -> Prompt:
    """One JSON line (plain or Spec-Bench format) -> Prompt; BenchError naming the line."""
    where = f"{source}, line {lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise BenchError(f"{where}: not valid JSON ({e.msg})", 2) from None
    if not isinstance(obj, dict):
        raise BenchError(f"{where}: expected a JSON object", 2)
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0]:
            raise BenchError(f"{where}: 'turns' must be a non-empty list of strings", 2)
        if not all(isinstance(t, str) and t for t in turns):
            raise BenchError(f"{where}: every turn must be a non-empty string", 2)
        text = turns[0]
    elif isinstance(obj.get("prompt"), str) and obj["prompt"]:
        text = obj["prompt"]
    else:
        raise BenchError(f"{where}: needs a non-empty string 'prompt' or a list 'turns'", 2)
    prediction = obj.get("prediction")
    if prediction is not None and (not isinstance(prediction, str) or not prediction):
        raise BenchError(f"{where}: 'prediction' must be a non-empty string", 2)
    category = str(obj.get("category") or "uncategorised")
    pid = obj.get("id", obj.get("question_id"))
    return Prompt(str(pid) if pid is not None else f"{category}-{lineno}", category, text,
                  list(obj["turns"]) if "turns" in obj else [text], prediction)


def load_prompts(path: str | None) -> list[Prompt]:
    try:
        if path is None:
            source = "bench_prompts.jsonl"
            content = resources.files("fastspec.bench").joinpath(source).read_text(encoding="utf-8")
        else:
            source = path
            content = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BenchError(f"cannot read prompts file {path}: {getattr(e, 'strerror', None) or e}", 2) from None
    prompts = [parse_prompt_line(line, n, source)
               for n, line in enumerate(content.splitlines(), 1) if line.strip()]
    if not prompts:
        raise BenchError(f"no prompts in {source}", 2)
    return prompts


def select_prompts(prompts: list[Prompt], categories: list[str] | None, limit: int | None) -> list[Prompt]:
    if categories:
        unknown = set(categories) - {p.category for p in prompts}
        if unknown:
            known = ", ".join(sorted({p.category for p in prompts}))
            raise BenchError(f"unknown categories: {', '.join(sorted(unknown))} (available: {known})", 2)
        prompts = [p for p in prompts if p.category in categories]
    if limit is not None:
        kept, seen = [], {}
        for p in prompts:
            seen[p.category] = seen.get(p.category, 0) + 1
            if seen[p.category] <= limit:
                kept.append(p)
        prompts = kept
    return prompts


def two_turn_prompts(prompts: list[Prompt]) -> list[Prompt]:
    """The prompts with a second turn (Spec-Bench's): what ``--multi-turn`` runs."""
    return [p for p in prompts if len(p.turns) >= 2]
