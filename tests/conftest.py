"""Shared fixtures: tiny random-weight GGUF models written at test time, and the real
model pair (fetched once into the user cache by fastspec.models)."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tiny_models  # noqa: E402

# no decoder here reads or writes the user's cost cache (each test that wants one gives
# its own file): a test's calibration must not depend on what another run left behind
os.environ["FASTSPEC_COST_CACHE"] = "0"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def bpe_pair(tiny_dir):
    """(target, identical draft, differently seeded draft), BPE vocabulary."""
    return tiny_models.write_pair(tiny_dir / "bpe", vocab="bpe")


@pytest.fixture(scope="session")
def spm_pair(tiny_dir):
    return tiny_models.write_pair(tiny_dir / "spm", vocab="spm")


@pytest.fixture(scope="session")
def bpe_target(bpe_pair):
    return bpe_pair[0]


@pytest.fixture(scope="session")
def real_pair():
    """Paths of the default Qwen2.5-Coder 1.5B/0.5B pair (downloaded on first use)."""
    from fastspec import models
    target, draft = models.DEFAULT_PAIR
    return str(models.resolve(target)), str(models.resolve(draft))


@pytest.fixture(scope="session")
def bpe_tempered_draft(tiny_dir):
    """The target's weights with a flatter output head: a draft that agrees with the
    target on some tokens and not others (partial acceptance)."""
    return tiny_models.write_tiny_llama(tiny_dir / "bpe" / "draft-tempered-bpe.gguf", vocab="bpe",
                                        seed=0, out_std=0.25)
