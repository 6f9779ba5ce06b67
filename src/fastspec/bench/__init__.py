"""``python -m fastspec.bench``: speculative decoding against the target alone on this machine.

Modules: ``prompts`` (built-in and JSONL prompts), ``runner`` (modes, measurements),
``report`` (summaries, tables, verdict), ``sweep`` (targets × drafts × settings heatmap),
``advise`` (cost curve + acceptance -> what pays here), ``cli`` (the command line).
"""
from fastspec.bench.cli import SCHEMA, build_parser, main
from fastspec.bench.prompts import BenchError, Prompt, load_prompts, select_prompts
from fastspec.bench.report import geomean, summarise, verdict
from fastspec.bench.runner import MODES, compare_outputs

__all__ = ["SCHEMA", "MODES", "BenchError", "Prompt", "build_parser", "compare_outputs", "geomean", "load_prompts",
           "main", "select_prompts", "summarise", "verdict"]
