"""The one token estimate the whole project uses when it has no tokenizer: ceil(len(text) / 4).

Four characters per token is OpenAI's rule of thumb for English text. The gateway charges admission
and routing load with it, the router turns prefix blocks into tokens with it, the mock engine counts a
prompt's tokens with it and the load generator sizes prompts with it — one constant, so the four agree.
"""

from __future__ import annotations

CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """Tokens of `text` by the rule above: ceil(len(text) / CHARS_PER_TOKEN); 0 for the empty string."""
    return -(-len(text) // CHARS_PER_TOKEN)
