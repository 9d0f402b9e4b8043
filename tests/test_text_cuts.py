"""Texts are cut before the tokenizer truncates them (introspect.models.cuts).

Below the bound of characters, the cut changes no token id: ``tokenize`` gives what the
tokenizer gives the whole texts. Above it, the tokenizer reads the bound only, so memory
stays flat in the length (a sentence pair's own truncation grows with its square).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from introspect.models import cuts
from introspect.models.load import _load_tokenizer, minilm_folder, tokenize

WORDS = ["the", "cat", "unaffably", "pneumonoultramicroscopicsilicovolcanoconiosis", "café",
         "naïve", "İstanbul", "한국어", "東京", "!", "?!", "...", "x" * 120, "don't", "e-mail",
         "\u0301accent", "ﷺ", "12,345.6", "\t", "   ", "\n\n", "ß", "ǅ", "\x00", "👍🏽"]


@pytest.fixture(scope="module")
def tokenizer():
    return _load_tokenizer(minilm_folder())


def text_of(rng: random.Random, words: int) -> str:
    return " ".join(["a"] + [rng.choice(WORDS) for _ in range(words)])


def whole(tokenizer, texts, pairs: bool, max_length: int) -> dict[str, torch.Tensor]:
    """What tokenize gave before the cut: the tokenizer on the whole texts."""
    if pairs:
        return tokenizer(list(texts[0::2]), list(texts[1::2]), padding=True, truncation=True,
                         max_length=max_length, return_tensors="pt")
    return tokenizer(list(texts), padding=True, truncation=True, max_length=max_length,
                     return_tensors="pt")


@pytest.mark.parametrize("max_length", [12, 13, 16])
@pytest.mark.parametrize("pairs", [True, False])
def test_below_the_bound_the_ids_are_those_of_the_whole_texts(tokenizer, max_length, pairs):
    rng = random.Random(max_length * 2 + pairs)
    for _ in range(60):
        sizes = [rng.choice([0, 1, 3, max_length // 2, max_length - 3, max_length,
                             max_length + 1, 2 * max_length, rng.randrange(200)])
                 for _ in range(4)]
        texts = [text_of(rng, size) for size in sizes]
        if rng.random() < 0.3:
            texts[1] = texts[0]  # a tie: the odd token of the budget goes to the second side
        texts = [t[:cuts.character_bound(max_length)] for t in texts]
        got = tokenize(tokenizer, texts, head="next-sentence" if pairs else "base",
                       max_length=max_length)
        expected = whole(tokenizer, texts, pairs, max_length)
        for name, tensor in got.tensors.items():
            assert torch.equal(tensor, expected[name]), (name, texts)


def test_pairs_keep_which_side_is_longer(tokenizer):
    # the first side longer by one token, both far over the budget: the first gets the
    # odd token of 12 - 3, however the cuts fall between words
    a, b = "unaffably " * 40 + "cat", "unaffably " * 40
    got = tokenize(tokenizer, [a, b], head="next-sentence", max_length=12)
    expected = whole(tokenizer, [a, b], True, 12)
    assert torch.equal(got.tensors["input_ids"], expected["input_ids"])
    assert got.notes == ["input 1 has 244 tokens; truncated to 12"]


class Spy:
    """A tokenizer that records the longest text each call reads."""

    def __init__(self, tokenizer):
        self.tokenizer, self.read = tokenizer, []

    def __call__(self, *texts, **options):
        lengths = [len(t) for side in texts for t in ([side] if isinstance(side, str) else side)]
        self.read.append(max(lengths))
        return self.tokenizer(*texts, **options)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_the_tokenizer_reads_at_most_the_bound(tokenizer):
    spy = Spy(tokenizer)
    long = "the cat sat on the mat. " * 10_000  # 240,000 characters
    got = tokenize(spy, [long, long + "!"], head="next-sentence")
    assert max(spy.read) == cuts.character_bound(512) == 32_768
    assert got.tensors["input_ids"].shape == (1, 512)
    assert got.notes == ["input 1 has 240,001 characters; the first 32,768 were read "
                         "(19117 tokens) and truncated to 512"]
    spy.read.clear()
    tokenize(spy, [long])
    assert max(spy.read) == 32_768


PEAK_SCRIPT = """
import resource, sys
from introspect.models.load import _load_tokenizer, minilm_folder, tokenize
tokenizer = _load_tokenizer(minilm_folder())
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
text = "the quick brown fox jumps over the lazy dog " * (int(sys.argv[1]) // 44)
tokenize(tokenizer, [text, text[1:]], head="next-sentence")
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB is Linux's")
def test_a_long_pair_costs_little_memory():
    # before the cut: about 3.8 GB for two texts of 125,000 characters
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    grown = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, "125000"], env=env, check=True,
                           capture_output=True, text=True).stdout
    assert int(grown) < 100, f"the peak grew by {grown} MiB"


def test_a_slow_tokenizer_gets_the_same_ids(tokenizer):
    from transformers import BertTokenizer

    slow = BertTokenizer.from_pretrained(minilm_folder(), local_files_only=True)
    texts = ["the cat sat " * 20, "on the mat " * 30]
    got = tokenize(slow, texts, head="next-sentence", max_length=16)
    expected = whole(slow, texts, True, 16)
    assert torch.equal(got.tensors["input_ids"], expected["input_ids"])
    assert torch.equal(got.tensors["input_ids"],
                       tokenize(tokenizer, texts, head="next-sentence",
                                max_length=16).tensors["input_ids"])
