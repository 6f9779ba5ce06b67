"""fastspec: speculative decoding for llama.cpp GGUF models, driven from Python.

    import fastspec
    result = fastspec.generate("def fib(n):", target="default-target", draft="default-draft")
    print(result.text, result.stats.tokens_per_second)
"""
from ._logging import set_verbosity
from .api import SOURCE_NAMES, GenerationResult, SpeculativeDecoder, StreamPiece, generate
from .config import GenerationConfig
from .corpus import SuffixCorpus
from .stats import GenerationStats, leviathan_speedup

__version__ = "0.1.0"
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"

__all__ = [
    "generate", "SpeculativeDecoder", "GenerationConfig", "GenerationResult", "GenerationStats", "StreamPiece",
    "SOURCE_NAMES", "SuffixCorpus",
    "leviathan_speedup", "set_verbosity", "LLAMA_CPP_COMMIT", "__version__",
]
