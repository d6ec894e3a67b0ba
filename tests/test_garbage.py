"""The garbage detector: the seeds' symptom is flagged, short correct answers are not."""

from __future__ import annotations

import pytest

from builder.verify.garbage import answer_matches, garbage_reasons

#: What the broken sm120 stacks answered, verbatim from the seeds.
SEED_GARBAGE = "  ,   ,  (!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
#: What the tiny model with random weights answers through the server (byte soup, loops).
RANDOM_WEIGHTS = "\ufffdVthe\ufffdIKe\ufffdIKe\ufffdIKe\ufffdI\ufffdKe\ufffdI\ufffdKe" * 3

GOOD = [
    "The capital of Kentucky is Frankfort.",
    "Paris",
    "42",
    "**42**",
    "Frankfort.",
    "17 + 25 = 42.",
    "Sure! The answer is **42**.\n\n- 17 + 25\n- = 42",
    "The capital of France is Paris. It has been the seat of government for centuries and is "
    "known for the Louvre, the Eiffel Tower and its cafés, and it is the largest city in the "
    "country.",
    "def add(x):\n    return x + 1\n",
    "Die Hauptstadt von Frankreich ist Paris.",
    "法国的首都是巴黎。",
]


@pytest.mark.parametrize("text", GOOD)
def test_language_is_not_garbage(text: str) -> None:
    assert garbage_reasons(text) == []


def test_seed_garbage_is_flagged_for_its_runs() -> None:
    reasons = garbage_reasons(SEED_GARBAGE)
    assert any("x '!'" in r for r in reasons)
    assert any("commas/'!'" in r for r in reasons)
    assert "run of whitespace" in reasons
    assert any("letters or digits" in r for r in reasons)


def test_random_weights_output_is_flagged() -> None:
    reasons = garbage_reasons(RANDOM_WEIGHTS)
    assert any("U+FFFD" in r for r in reasons)
    assert any("repeat" in r for r in reasons)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no visible text"),
        ("   \n ", "no visible text"),
        ("aaaaaaaaaaaa", "run of 12 x 'a'"),
        (", , , ,", "commas/'!'"),
        ("Paris    Paris", "run of whitespace"),
        ("Paris\n\n\n\nParis", "run of whitespace"),
        ("\x00\x01\x02\x03 ok", "printable"),
        ("?? %% && ## ;; ok", "letters or digits"),
        ("the the the the cat", "'the' is 4 of 5 words"),
        ("I think it is Paris and " * 4, "word 3-grams repeat"),
        ("abcdefgh" * 10, "8-character fragments repeat"),
    ],
)
def test_each_symptom_has_its_reason(text: str, reason: str) -> None:
    assert any(reason in r for r in garbage_reasons(text)), garbage_reasons(text)


def test_limits_are_exclusive() -> None:
    """Eight of a kind is still language ("Haaaaaaaa"); nine is a run."""
    assert garbage_reasons("H" + "a" * 8 + ", Frankfort") == []
    assert garbage_reasons("H" + "a" * 9 + ", Frankfort") == ["run of 9 x 'a'"]
    assert garbage_reasons("three words only") == []
    assert garbage_reasons("Paris Paris Paris") == []


@pytest.mark.parametrize(
    ("text", "pattern", "expected"),
    [
        ("The capital of Kentucky is Frankfort.", "frankfort", True),
        ("FRANKFORT", "frankfort", True),
        ("The capital of Kentucky is Louisville.", "frankfort", False),
        ("Paris", "paris", True),
        ("42", r"\b42\b", True),
        ("142", r"\b42\b", False),
        ("The answer is 42.", r"\b42\b", True),
        (SEED_GARBAGE, "paris", False),
    ],
)
def test_answer_matches(text: str, pattern: str, expected: bool) -> None:
    assert answer_matches(text, pattern) is expected
