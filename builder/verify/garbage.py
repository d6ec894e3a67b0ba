"""Does a model's answer look like language? The seeds' broken stacks served HTTP 200 with text.

A wrong kernel (a bad FlashInfer/NVFP4 tactic, a stale JIT module) rarely crashes the server: it
answers fluently-shaped nonsense. The seeds saw runs of whitespace, commas and '!!!!'; random
weights give byte soup with U+FFFD and repeated fragments. These heuristics flag those shapes
and stay quiet on short, correct answers ("42", "Paris", one sentence). They judge form only;
whether the answer is right is `answer_matches`, against the manifest's pattern.
"""

from __future__ import annotations

import re
from collections import Counter

MAX_SAME_CHAR_RUN = 8
#: Below this share of letters/digits among the non-space, non-markdown characters: symbol soup.
MIN_ALNUM_SHARE = 0.6
#: Below this share of printable characters (whitespace counts as printable): byte soup.
MIN_PRINTABLE_SHARE = 0.8
MAX_TOP_WORD_SHARE = 0.5
MIN_WORDS_FOR_TOP_WORD = 4
MAX_REPEATED_NGRAM_RATIO = 0.5
WORD_NGRAM, MIN_WORD_NGRAMS = 3, 6
CHAR_NGRAM, MIN_CHARS_FOR_CHAR_NGRAMS = 8, 40

_SAME_CHAR_RUN = re.compile(r"(.)\1{" + str(MAX_SAME_CHAR_RUN) + ",}", re.DOTALL)
#: Four or more commas/bangs with only whitespace between them: ", , ,", "!!!!".
_PUNCT_RUN = re.compile(r"[,!](?:\s*[,!]){3,}")
#: Three or more spaces inside a line (indentation at a line start is fine).
_INLINE_SPACE_RUN = re.compile(r"(?<=\S)[ \t]{3,}(?=\S)")
_BLANK_LINE_RUN = re.compile(r"\n[ \t]*\n[ \t]*\n[ \t]*\n")
_MARKDOWN = set("*_`#>|-")
_WORD = re.compile(r"\w+")


def garbage_reasons(text: str) -> list[str]:
    """Why text does not look like language; an empty list means it does."""
    if not text.strip():
        return ["no visible text"]
    reasons = [
        *_run_reasons(text),
        *_character_reasons(text),
        *_repetition_reasons(text),
    ]
    return reasons


def answer_matches(text: str, pattern: str) -> bool:
    """The manifest's expectation: a case-insensitive regular expression found anywhere."""
    return re.search(pattern, text, re.IGNORECASE) is not None


def _run_reasons(text: str) -> list[str]:
    reasons: list[str] = []
    same = _SAME_CHAR_RUN.search(text)
    if same:
        reasons.append(f"run of {len(same.group(0))} x {same.group(1)!r}")
    punct = _PUNCT_RUN.search(text)
    if punct:
        reasons.append(f"run of commas/'!': {punct.group(0)[:40]!r}")
    if _INLINE_SPACE_RUN.search(text) or _BLANK_LINE_RUN.search(text):
        reasons.append("run of whitespace")
    return reasons


def _character_reasons(text: str) -> list[str]:
    reasons: list[str] = []
    if "\ufffd" in text:
        reasons.append(f"{text.count(chr(0xFFFD))} x U+FFFD (invalid bytes)")
    printable = sum(1 for c in text if c.isprintable() or c.isspace()) / len(text)
    if printable < MIN_PRINTABLE_SHARE:
        reasons.append(f"only {printable:.0%} printable characters")
    visible = [c for c in text if not c.isspace() and c not in _MARKDOWN]
    if visible:
        alnum = sum(1 for c in visible if c.isalnum()) / len(visible)
        if alnum < MIN_ALNUM_SHARE:
            reasons.append(f"only {alnum:.0%} letters or digits")
    return reasons


def _repetition_reasons(text: str) -> list[str]:
    reasons: list[str] = []
    words = [w.lower() for w in _WORD.findall(text)]
    if len(words) >= MIN_WORDS_FOR_TOP_WORD:
        word, count = Counter(words).most_common(1)[0]
        if count / len(words) > MAX_TOP_WORD_SHARE:
            reasons.append(f"{word!r} is {count} of {len(words)} words")
    word_ngrams = [tuple(words[i : i + WORD_NGRAM]) for i in range(len(words) - WORD_NGRAM + 1)]
    if len(word_ngrams) >= MIN_WORD_NGRAMS:
        ratio = repeated_ratio(word_ngrams)
        if ratio > MAX_REPEATED_NGRAM_RATIO:
            reasons.append(f"{ratio:.0%} of word {WORD_NGRAM}-grams repeat")
    if len(text) >= MIN_CHARS_FOR_CHAR_NGRAMS:
        grams = [text[i : i + CHAR_NGRAM] for i in range(len(text) - CHAR_NGRAM + 1)]
        ratio = repeated_ratio(grams)
        if ratio > MAX_REPEATED_NGRAM_RATIO:
            reasons.append(f"{ratio:.0%} of {CHAR_NGRAM}-character fragments repeat")
    return reasons


def repeated_ratio(items: list[tuple[str, ...]] | list[str]) -> float:
    """Share of items that repeat an earlier one: 0 for all-distinct, near 1 for a loop."""
    if not items:
        return 0.0
    return 1 - len(set(items)) / len(items)
