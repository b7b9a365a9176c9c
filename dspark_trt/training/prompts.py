"""Prompts for distillation (the target continues them) and held-out prompts for benchmarks.

The two lists share no prompt. Each entry is ``("chat", user_message)`` — rendered through the target
tokenizer's chat template with the assistant turn opened — or ``("text", raw_text)``: prose or code the
target continues as plain text.
"""

from __future__ import annotations

__all__ = ["TRAIN_PROMPTS", "HELDOUT_PROMPTS", "render_prompts"]

TRAIN_PROMPTS: tuple[tuple[str, str], ...] = (
    ("chat", "What is the capital of France?"),
    ("chat", "Explain photosynthesis in simple terms."),
    ("chat", "Write a short poem about the sea."),
    ("chat", "Give me three tips for better sleep."),
    ("chat", "How do I make a cup of green tea?"),
    ("chat", "What is the difference between weather and climate?"),
    ("chat", "Summarize the plot of Romeo and Juliet."),
    ("chat", "Write a Python function that reverses a string."),
    ("chat", "What are the benefits of regular exercise?"),
    ("chat", "Explain what a black hole is."),
    ("chat", "How does a bicycle stay upright?"),
    ("chat", "List five common fruits and their colors."),
    ("chat", "What is machine learning?"),
    ("chat", "Describe a typical day of a farmer."),
    ("chat", "Write a haiku about autumn leaves."),
    ("chat", "How can I improve my public speaking?"),
    ("chat", "What causes the seasons on Earth?"),
    ("chat", "Explain recursion to a beginner programmer."),
    ("chat", "Write an email asking my manager for a day off."),
    ("chat", "What is the Pythagorean theorem?"),
    ("chat", "Give me a recipe for pancakes."),
    ("chat", "Why is the sky blue?"),
    ("chat", "What are the main causes of air pollution?"),
    ("chat", "Tell me a short story about a brave mouse."),
    ("chat", "How do vaccines work?"),
    ("chat", "Write a SQL query that counts the rows of a table named users."),
    ("chat", "What is the difference between a list and a tuple in Python?"),
    ("chat", "Explain how the internet works."),
    ("chat", "What should I pack for a weekend hiking trip?"),
    ("chat", "Describe the water cycle."),
    ("chat", "Who was Albert Einstein?"),
    ("chat", "How do I calculate the area of a circle?"),
    ("chat", "Write a motivational message for a student before an exam."),
    ("chat", "What is an operating system?"),
    ("chat", "Suggest a name for a new coffee shop and explain why."),
    ("chat", "How do plants get water from the soil?"),
    ("chat", "Explain the rules of chess briefly."),
    ("chat", "What is the boiling point of water and why does it change with altitude?"),
    ("chat", "Write a JavaScript function that adds two numbers."),
    ("chat", "What are renewable energy sources?"),
    ("chat", "How can I learn a new language quickly?"),
    ("chat", "Describe the solar system."),
    ("chat", "What is a healthy breakfast?"),
    ("chat", "Explain what DNA is."),
    ("chat", "Write a thank-you note to a friend who helped me move."),
    ("chat", "What is inflation in economics?"),
    ("chat", "How does a refrigerator keep food cold?"),
    ("chat", "Give me a list of ten animals that live in the ocean."),
    ("text", "Once upon a time, in a small village by the mountains, there lived"),
    ("text", "The history of the Roman Empire begins"),
    ("text", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("text", "import numpy as np\n\n\ndef normalize(x):\n"),
    ("text", "The most important thing to remember when cooking rice is"),
    ("text", "In mathematics, a prime number is"),
    ("text", "class Stack:\n    def __init__(self):\n"),
    ("text", "The city was quiet that morning. The streets"),
    ("text", "Scientists have recently discovered that"),
    ("text", "for i in range(10):\n"),
    ("text", "The first step in writing a good essay is"),
    ("text", "Water is made of two hydrogen atoms and"),
    ("text", "# Read a CSV file and print the average of the second column\nimport csv\n"),
    ("text", "The train left the station at noon, and"),
    ("text", "A computer program is a sequence of"),
    ("text", "Dear hiring manager,\n\nI am writing to apply for"),
)

HELDOUT_PROMPTS: tuple[tuple[str, str], ...] = (
    ("chat", "What is the tallest mountain in the world?"),
    ("chat", "Explain how a rainbow forms."),
    ("chat", "Write a short poem about the moon."),
    ("chat", "Give me three tips for staying focused while studying."),
    ("chat", "What is the difference between a virus and a bacterium?"),
    ("chat", "Write a Python function that checks whether a number is even."),
    ("chat", "How do airplanes fly?"),
    ("chat", "Describe the life cycle of a butterfly."),
    ("text", "The old lighthouse keeper opened the door and"),
    ("text", "def is_palindrome(s):\n"),
    ("text", "Electricity is the flow of"),
    ("text", "The best way to start a garden is"),
)


def render_prompts(prompts, tokenizer) -> list[list[int]]:
    """Token ids of each prompt: chat turns through the tokenizer's chat template (``runtime/prompting.py``, as
    ``dspark generate --prompt`` feeds them), text as is."""
    from ..runtime.prompting import encode_prompt

    return [encode_prompt(tokenizer, text, raw=kind != "chat")[0] for kind, text in prompts]
