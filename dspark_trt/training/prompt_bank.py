"""A larger, varied bank of training prompts: request forms × subjects, deterministic, disjoint from the held-out set.

A drafter trained on a few dozen target-written answers learns them by heart (docs/smollm2.md). The bank
crosses ``CHAT_FORMS`` with ``SUBJECTS`` (everyday, science, history, arts, work — chat turns), and
``CODE_FORMS`` with ``CODE_TASKS`` (Python / JavaScript / SQL requests and plain-text code openings), then
shuffles with a seeded generator, so the first ``n`` prompts of ``prompt_bank(n)`` are a varied sample of
all of them. Subjects that the held-out benchmark prompts ask about (``HELD_OUT_SUBJECTS``) are left out,
and ``prompt_bank`` refuses to return any prompt of ``prompts.HELDOUT_PROMPTS`` (tested).

Validation while training (``training/validate.py``) needs target text the drafter never trains on:
``validation_bank`` draws from ``VALIDATION_SUBJECTS`` and ``VALIDATION_TASKS`` (every tenth subject, every
eighth code task), which ``prompt_bank(n, holdout=True)`` leaves out — split by prompt and subject, never by
token. Past the base bank, ``prompt_bank`` continues with the chat forms crossed with ``MODIFIERS`` (a larger
budget, e.g. the GPU preset, gets distinct prompts rather than more continuations of the same ones); the first
prompts of a larger bank are the prompts of a smaller one (a larger budget appends to the text store).
"""

from __future__ import annotations

import random

from .prompts import HELDOUT_PROMPTS, TRAIN_PROMPTS

__all__ = ["prompt_bank", "validation_bank", "SUBJECTS", "CODE_TASKS", "HELD_OUT_SUBJECTS", "VALIDATION_SUBJECTS",
           "VALIDATION_TASKS", "MODIFIERS"]

#: what the held-out prompts ask about: no bank prompt mentions these words
HELD_OUT_SUBJECTS = ("mountain", "rainbow", "moon", "focus", "studying", "virus", "bacteri", "even", "airplane",
                     "fly", "butterfl", "lighthouse", "palindrome", "electric", "garden")

SUBJECTS = (
    "the French Revolution", "volcanoes", "honey bees", "the printing press", "coral reefs", "the human heart",
    "compound interest", "the Great Wall of China", "earthquakes", "penguins", "the Olympic Games", "glaciers",
    "the stock market", "bread baking", "the immune system", "solar panels", "jazz music", "the Amazon rainforest",
    "ancient Egypt", "tides", "chess openings", "the periodic table", "wind turbines", "democracy", "coffee",
    "sleep", "meditation", "the Renaissance", "magnets", "deserts", "friendship", "recycling", "the piano",
    "photosynthesis in algae", "the Moon landing of 1969", "owls", "the water table", "budgeting", "volunteering",
    "the internet of things", "cloud computing", "encryption", "sharks", "the Industrial Revolution", "vitamins",
    "time management", "the speed of light", "dinosaurs", "hurricanes", "the Silk Road", "origami", "yoga",
    "the Eiffel Tower", "recessions", "chocolate", "elephants", "the theory of evolution", "telescopes", "opera",
    "public libraries", "composting", "the Milky Way", "kindness", "teamwork", "leadership", "job interviews",
    "negotiation", "the Roman Colosseum", "batteries", "3D printing", "bridges", "the ozone layer", "wolves",
    "tea ceremonies", "marathons", "board games", "photography", "watercolor painting", "the Nile river",
    "earth's atmosphere", "gravity", "sound waves", "the history of money", "vaccination campaigns in history",
    "robots", "self-driving cars", "spreadsheets", "email etiquette", "remote work", "city parks", "trains",
    "the Arctic", "camels", "sushi", "pizza", "olive oil", "the human brain", "memory techniques", "habits",
    "climate change", "oceans", "forests", "rivers", "the Sahara desert", "ants", "dolphins", "whales", "tigers",
    "birds' migration", "seasons in Japan", "Shakespeare's plays", "poetry", "novels", "museums", "architecture",
    "the first computers", "video games", "social media", "smartphones", "clean drinking water", "first aid",
)

CHAT_FORMS = (
    "Explain {s} in simple terms.", "What is interesting about {s}?", "Give me three facts about {s}.",
    "Write a short paragraph about {s}.", "How does {s} affect everyday life?", "What are the pros and cons of {s}?",
    "Write a short poem about {s}.", "Describe {s} to a ten-year-old.", "Summarize the history of {s}.",
    "List five questions a student might ask about {s}, with short answers.", "Tell me a short story involving {s}.",
    "Why do people care about {s}?", "Write a tweet about {s}.", "What are common misconceptions about {s}?",
    "Compare {s} with something similar and explain the difference.", "Give me a quiz with three questions about {s}.",
)

CODE_TASKS = (
    ("reverses a list", "reverse_list"), ("counts the vowels in a string", "count_vowels"),
    ("returns the largest number in a list", "largest"), ("computes the factorial of n", "factorial"),
    ("checks whether a string is a valid email address", "is_valid_email"), ("merges two sorted lists", "merge_sorted"),
    ("removes duplicates from a list while keeping the order", "dedupe"), ("converts Celsius to Fahrenheit", "c_to_f"),
    ("computes the average of a list of numbers", "average"), ("finds the most common word in a text", "most_common_word"),
    ("checks whether a year is a leap year", "is_leap_year"), ("flattens a nested list", "flatten"),
    ("sorts a list of dictionaries by a key", "sort_by_key"), ("computes the greatest common divisor", "gcd"),
    ("reads a text file and counts its lines", "count_lines"), ("implements binary search", "binary_search"),
    ("capitalizes every word of a sentence", "title_case"), ("returns the n-th prime number", "nth_prime"),
    ("transposes a matrix", "transpose"), ("computes the sum of the digits of a number", "digit_sum"),
    ("groups words by their first letter", "group_by_initial"), ("checks whether two strings are anagrams", "is_anagram"),
    ("computes a running total of a list", "running_total"), ("converts a number to binary", "to_binary"),
)

CODE_FORMS = (
    ("chat", "Write a Python function that {t}."), ("chat", "Write a JavaScript function that {t}."),
    ("chat", "Explain step by step how to write a program that {t}."),
    ("chat", "Write a Python function that {t}, with a docstring and an example."),
    ("text", "def {f}("), ("text", "# Python: a function that {t}\n"), ("text", "// JavaScript: a function that {t}\nfunction {f}("),
)

TEXT_FORMS = ("{S} is", "The history of {s} begins", "Here is a short story about {s}:\n\n", "A beginner's guide to {s}.\n\n",
              "Ten facts about {s}:\n1.")


VALIDATION_SUBJECTS = SUBJECTS[5::10]  # validation prompts only (``prompt_bank(holdout=True)`` leaves them out)
VALIDATION_TASKS = CODE_TASKS[3::8]

#: appended to the chat forms past the base bank (larger budgets)
MODIFIERS = (" Keep it short.", " Answer in detail.", " Use a numbered list.", " Explain it as to an expert.")


def _all_prompts(subjects=SUBJECTS, tasks=CODE_TASKS) -> list[tuple[str, str]]:
    out = [("chat", form.format(s=s)) for s in subjects for form in CHAT_FORMS]
    out += [("text", form.format(s=s, S=s[0].upper() + s[1:])) for s in subjects for form in TEXT_FORMS]
    out += [(kind, form.format(t=t, f=f)) for t, f in tasks for kind, form in CODE_FORMS]
    return out


def _usable(prompts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    held = {text for _, text in HELDOUT_PROMPTS} | {text for _, text in TRAIN_PROMPTS}
    return [p for p in prompts if p[1] not in held and not any(w in p[1].lower() for w in HELD_OUT_SUBJECTS)]


def prompt_bank(n: int, *, seed: int = 0, holdout: bool = False) -> tuple[tuple[str, str], ...]:
    """``n`` prompts (``("chat" | "text", text)``, as ``prompts.TRAIN_PROMPTS``): a seeded shuffle of the bank, never
    a held-out prompt nor one of ``TRAIN_PROMPTS`` (those are always trained on); with ``holdout``, never a
    prompt about a validation subject or task either. Past the base bank, the chat forms with ``MODIFIERS``
    (seeded shuffle too); at most all of them (``len`` tells)."""
    if holdout:
        subjects = tuple(s for s in SUBJECTS if s not in VALIDATION_SUBJECTS)
        tasks = tuple(t for t in CODE_TASKS if t not in VALIDATION_TASKS)
    else:
        subjects, tasks = SUBJECTS, CODE_TASKS
    pool = _usable(_all_prompts(subjects, tasks))
    random.Random(seed).shuffle(pool)
    if n > len(pool):
        chat = [p for p in pool if p[0] == "chat"]
        more = _usable([("chat", text + m) for m in MODIFIERS for _, text in chat])
        random.Random(seed + 1).shuffle(more)
        pool += more
    return tuple(pool[: max(0, n)])


def validation_bank(n: int, *, seed: int = 0) -> tuple[tuple[str, str], ...]:
    """``n`` prompts about ``VALIDATION_SUBJECTS`` / ``VALIDATION_TASKS`` (seeded shuffle): never in
    ``prompt_bank(…, holdout=True)``, ``TRAIN_PROMPTS`` or the held-out benchmark prompts."""
    pool = _usable(_all_prompts(VALIDATION_SUBJECTS, VALIDATION_TASKS))
    random.Random(seed + 7).shuffle(pool)
    return tuple(pool[: max(0, n)])
