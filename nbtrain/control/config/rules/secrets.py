"""Secrets never go into a config: a key that names one, or a value that looks like a token."""

from __future__ import annotations

import re
from typing import Any

from nbtrain.control.config.problems import Problems, config_values

# Keys whose text value is a credential. Tokenizer settings (pad_token, eos_token, ...) are not.
_SECRET_KEYS = frozenset(
    {
        "token", "hub_token", "hf_token", "use_auth_token", "auth_token", "access_token", "api_key",
        "apikey", "password", "passwd", "secret", "secret_key", "private_key", "client_secret",
    }
)  # fmt: skip
_SECRET_SUFFIXES = ("_api_key", "_apikey", "_password", "_secret", "_secret_key", "_access_token",
                    "_auth_token", "_hub_token", "_hf_token")  # fmt: skip
HF_TOKEN_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")  # what a Hugging Face access token looks like
SECRET_ADVICE = (
    "a config is kept in plain text (config.yaml and resolved.json in the run directory, the run record "
    "in the saved notebook), so nbtrain takes no secrets in it. Remove it and set it in the environment, "
    "which the training process inherits: HF_TOKEN (or run `hf auth login` once) for the Hugging Face "
    "Hub, WANDB_API_KEY (or `wandb login`) for Weights & Biases"
)


def is_secret_key(key: str) -> bool:
    k = key.lower()
    return k in _SECRET_KEYS or k.endswith(_SECRET_SUFFIXES)


def secret_problems(raw: dict[str, Any], probs: Problems) -> None:
    """Refuse credentials anywhere in the config (a secret-named key with a text value, or a value that
    is a Hugging Face token), without repeating them."""
    for path, value in config_values(raw):
        if not isinstance(value, str):
            continue
        key = path[-1] if path else None
        if isinstance(key, str) and value.strip() and is_secret_key(key):
            probs.add(path, f"'{key}' holds a secret: {SECRET_ADVICE}", secret=value)
        elif m := HF_TOKEN_VALUE.search(value):
            probs.add(path, f"this value holds a Hugging Face token: {SECRET_ADVICE}", secret=m.group(0))
