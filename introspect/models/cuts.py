"""Texts cut before the tokenizer truncates them, so memory stays linear in their length.

A fast tokenizer truncates a sentence pair by splitting each side into overflowing pieces
of ``max_length`` tokens and pairing every piece of one side with every piece of the
other: two texts of n tokens cost n² / max_length tokens of memory (3 GB at 60,000
characters each, a crash at 125,000). What the model sees is only the first
``max_length`` tokens, so each text is cut here first, in two steps:

1. to ``max_length * CHARACTERS_PER_POSITION`` characters (``character_bound``): the
   tokenizer never reads more than that, whatever the input's size. Below this bound the
   token ids are exactly those of the whole text;
2. to the first word boundary after enough tokens (``cut_after``), counted by tokenizing
   the text once without truncation (linear). A cut falls between two words, so the
   tokens before it are the ones the whole text gives; and the pair keeps which side is
   the longer, which decides the side that gets the odd token of a pair's budget.

A token covers at least one character of a word, and a BERT WordPiece token rarely more
than 20 (a word over 100 characters is one ``[UNK]``); 64 characters a position leaves
room for long words, punctuation and whitespace. A text whose first bound of characters
holds fewer tokens than that (pages of blank space, a single word of 40,000 letters) is
read only that far, and the note says so.
"""

from __future__ import annotations

from typing import Any

CHARACTERS_PER_POSITION = 64


def character_bound(max_length: int) -> int:
    """The most characters of one text the tokenizer reads: 32,768 for 512 positions."""
    return max_length * CHARACTERS_PER_POSITION


def word_tokens(tokenizer: Any, text: str) -> tuple[int, list[int]]:
    """(tokens the text gives, without special ones; the character where each word starts).

    The starts are those of each token that begins a new word (a pre-token: BERT splits
    on whitespace and punctuation), in order, -1 inside a word; cutting a text at one of
    them leaves the tokens before it unchanged. A slow (Python) tokenizer gives no
    offsets, and no starts: its texts are cut to the bound of characters only.
    """
    if not getattr(tokenizer, "is_fast", False):  # no offsets; its truncation is linear
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]), []
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    words = encoding.word_ids()
    offsets = encoding["offset_mapping"]
    starts = [0] * len(words)
    previous = None
    for i, word in enumerate(words):
        starts[i] = offsets[i][0] if word != previous else -1  # -1: inside a word
        previous = word
    return len(words), starts


def cut_after(text: str, starts: list[int], count: int) -> tuple[str, int]:
    """The text up to the first word boundary after at least ``count`` tokens, and the
    tokens it holds."""
    for i in range(count, len(starts)):
        if starts[i] >= 0:
            return text[:starts[i]], i
    return text, len(starts)


def cut_pair(first: tuple[str, list[int]], second: tuple[str, list[int]],
             keep: int) -> tuple[str, str]:
    """A sentence pair cut so that it truncates to the same tokens as the whole pair.

    Each side keeps at least ``keep`` tokens (more than the model's positions), and the
    longer side stays the longer one: the tokenizer gives the odd token of a pair's
    budget to the longer side (to the second on a tie), so the order of the two lengths
    is all it reads of them beyond the budget. Each side is given as (text, word starts
    from ``word_tokens``).
    """
    (a, a_starts), (b, b_starts) = first, second
    cut_a, count_a = cut_after(a, a_starts, keep)
    cut_b, count_b = cut_after(b, b_starts, keep)
    if len(a_starts) > len(b_starts) and count_a <= count_b:
        cut_a, count_a = cut_after(a, a_starts, count_b + 1)  # the first has these tokens
    elif len(a_starts) <= len(b_starts) and count_a > count_b:
        cut_b, count_b = cut_after(b, b_starts, count_a)  # the second has as many
    return cut_a, cut_b
