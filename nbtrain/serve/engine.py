"""Generation with a run's model, shared by the built-in server and one-shot ``generate``.

Runs in a server or generate process, never in a kernel (it imports torch through
``nbtrain.worker.tuned``). One copy of the weights answers for both the tuned and the base model: a
LoRA/QLoRA run's adapter is switched off for base answers; a full fine-tune needs the base weights
as a second model. Generation is serialised by one lock, since switching the adapter off and seeding
the random generator are global to the model.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtrain.rundir import RunPaths, read_json

TUNED = "tuned"
BASE = "base"
DEFAULT_MAX_TOKENS = 128


class RequestError(ValueError):
    """A request the engine cannot answer; the message says what to change (HTTP 400)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


@dataclass
class Params:
    """OpenAI-style generation settings, checked."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | None = None

    @classmethod
    def from_request(cls, body: dict[str, Any]) -> Params:
        p = cls()
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        if mt is not None:
            if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
                raise RequestError(f"max_tokens must be a positive integer, not {mt!r}", "max_tokens")
            p.max_tokens = mt
        for key, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
            v = body.get(key)
            if v is None:
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
                raise RequestError(f"{key} must be a number from {lo} to {hi}, not {v!r}", key)
            setattr(p, key, float(v))
        seed = body.get("seed")
        if seed is not None:
            if not isinstance(seed, int) or isinstance(seed, bool):
                raise RequestError(f"seed must be an integer, not {seed!r}", "seed")
            p.seed = seed
        stop = body.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        if stop is not None:
            if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
                raise RequestError("stop must be a non-empty string or a list of up to 4 of them", "stop")
            p.stop = stop
        n = body.get("n", 1)
        if n != 1:
            raise RequestError("n must be 1: this server returns one choice per request", "n")
        if body.get("stream"):
            raise RequestError("stream is not supported by the built-in server; send stream: false", "stream")
        return p


@dataclass
class Output:
    text: str
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int


def model_names(run_dir: str | Path) -> dict[str, str]:
    """The model ids a run is served under: {"tuned": "<run name>", "base": "<run name>:base"}."""
    resolved = read_json(RunPaths(Path(run_dir)).resolved)
    name = str(resolved.get("name") or Path(run_dir).name)
    return {TUNED: name, BASE: f"{name}:base"}


class Engine:
    def __init__(
        self, run_dir: str | Path, *, base_only: bool = False, device: str = "auto", dtype: str | None = None
    ) -> None:
        import torch

        from nbtrain.worker.tuned import load_tuned

        self.run_dir = Path(run_dir).resolve()
        self.names = model_names(self.run_dir)
        if base_only:
            del self.names[TUNED]
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self.method = read_json(RunPaths(self.run_dir).resolved)["config"]["method"]
        self.lock = threading.Lock()
        self.base_model: Any = None
        self.model, self.tok = load_tuned(self.run_dir, base=base_only, dtype=dtype, device=device)
        if not base_only and not hasattr(self.model, "disable_adapter"):
            # A full fine-tune replaced the weights: base answers need the base model itself.
            self.base_model, _ = load_tuned(self.run_dir, base=True, dtype=dtype, device=device)

    # --------------------------------------------------------------------------------- names
    def which(self, model: Any) -> str:
        """TUNED or BASE for a request's ``model`` (its id, or the aliases "tuned" / "base")."""
        if model is None:
            return TUNED if TUNED in self.names else BASE
        for kind, name in self.names.items():
            if model in (name, kind):
                return kind
        raise RequestError(
            f"model {model!r} is not served here; use one of {', '.join(self.names.values())}",
            "model",
            404,
        )

    @contextlib.contextmanager
    def _model_for(self, kind: str) -> Iterator[Any]:
        if kind == TUNED or TUNED not in self.names:
            yield self.model  # with --base-only the loaded model is the base
        elif self.base_model is not None:
            yield self.base_model
        else:
            with self.model.disable_adapter():
                yield self.model

    # ---------------------------------------------------------------------------- generation
    def chat(self, messages: Any, kind: str, params: Params) -> Output:
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list of {role, content} objects", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
                raise RequestError(f"messages[{i}] must be an object with 'role' and 'content'", "messages")
            if not isinstance(m["content"], str):
                raise RequestError(f"messages[{i}].content must be a string (text only)", "messages")
        if not getattr(self.tok, "chat_template", None):
            raise RequestError(
                "this model's tokenizer has no chat template; use /v1/completions with a plain prompt",
                "messages",
            )
        msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
        ids = self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)
        return self._generate(list(ids["input_ids"]), kind, params)

    def complete(self, prompt: Any, kind: str, params: Params) -> Output:
        if not isinstance(prompt, str):
            raise RequestError("prompt must be a string", "prompt")
        ids = self.tok(prompt, add_special_tokens=True)["input_ids"]
        return self._generate(list(ids), kind, params)

    def _generate(self, input_ids: list[int], kind: str, params: Params) -> Output:
        import torch

        ids = torch.tensor([input_ids], device=self.device)
        kwargs: dict[str, Any] = {
            "max_new_tokens": params.max_tokens,
            "pad_token_id": self.tok.pad_token_id,
            "attention_mask": torch.ones_like(ids),
        }
        if params.temperature > 0:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if params.stop:
            kwargs.update(stop_strings=params.stop, tokenizer=self.tok)
        with self.lock, torch.inference_mode(), self._model_for(kind) as model:
            if params.seed is not None:
                torch.manual_seed(params.seed)
            out = model.generate(input_ids=ids, **kwargs)
        new = out[0, len(input_ids) :].tolist()
        text = self.tok.decode(new, skip_special_tokens=True)
        finish = "length" if len(new) >= params.max_tokens else "stop"
        for s in params.stop or []:
            cut = text.find(s)
            if cut >= 0:
                text, finish = text[:cut], "stop"
        eos = self.tok.eos_token_id
        if new and new[-1] == eos:
            finish = "stop"
        return Output(text, finish, len(input_ids), len(new))
