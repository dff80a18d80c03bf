"""Trying a run's model: an OpenAI-compatible server on loopback (vLLM when installed with a GPU, else a
small built-in one on transformers) and one-shot generation.

``control`` is the kernel side (stdlib only: it starts, finds and stops server processes and talks HTTP
to them); ``server``, ``engine`` and ``generate`` run in their own processes and load the model.
"""
