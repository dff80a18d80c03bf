"""Generation with a run's model, shared by the built-in server and one-shot ``generate``.

Runs in a server or generate process, never in a kernel (it imports torch through
``nbtrain.worker.tuned``). One copy of the weights answers for both the tuned and the base model: a
LoRA/QLoRA run's adapter is switched off for base answers; a full fine-tune needs the base weights
as a second model. Generation is serialised by one lock, since switching the adapter off and seeding
the random generator are global to the model; the tokenizer has its own lock (a fast tokenizer used
from two threads at once fails).

A request's prompt and completion together fit the model's context (``context_length``): more is
refused before anything is generated. A generation given ``cancel`` checks it after every token (and
while it waits for the lock) and stops when it says so: the server passes "the client went away".
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbtrain.contract.rundir import RunPaths, read_json
from nbtrain.worker.serve.batching import Batcher
from nbtrain.worker.serve.images import content_parts
from nbtrain.worker.serve.request import Params, RequestError

TUNED = "tuned"
BASE = "base"
DEFAULT_MAX_TOKENS = 128
FALLBACK_CONTEXT = 4096  # a model whose config names no context length
CHARS_PER_TOKEN_AT_MOST = 64  # no tokenizer's tokens average more characters than this over a prompt
MIN_TEMPERATURE = 1e-5  # below it sampling is greedy (dividing logits by ~0 overflows)


class Cancelled(Exception):
    """The generation was stopped by its ``cancel`` check (the client went away)."""

    def __init__(self, generated: int, max_tokens: int) -> None:
        super().__init__(f"stopped after {generated} of {max_tokens} tokens")
        self.generated = generated
        self.max_tokens = max_tokens


@dataclass
class Prompt:
    """A checked request's token ids and the completion length it may have; ``extra``: what else the
    model takes with them (a vision-language model's pixel values and image sizes)."""

    ids: list[int]
    max_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)


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


def context_length(model: Any, tok: Any) -> int:
    """The most tokens (prompt + completion) the model takes, from its config, else its tokenizer."""
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config()
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    v = getattr(tok, "model_max_length", None)
    if isinstance(v, int) and 0 < v < 10**7:  # transformers puts a huge number there when unknown
        return v
    return FALLBACK_CONTEXT


class _Watch:
    """A stopping criterion run after every generated token: stops when ``cancel()`` says so, and hands
    the new text to ``on_text`` as it grows (held back where a stop string may be starting)."""

    def __init__(
        self,
        tok: Any,
        tok_lock: threading.Lock,
        prompt_len: int,
        stop: list[str] | None,
        cancel: Callable[[], bool] | None,
        on_text: Callable[[str], None] | None,
    ) -> None:
        self.tok, self.tok_lock, self.prompt_len = tok, tok_lock, prompt_len
        self.stop = stop or []
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.cancel, self.on_text = cancel, on_text
        self.sent = ""
        self.cancelled = False
        self.generated = 0

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        new = input_ids[0, self.prompt_len :].tolist()
        self.generated = len(new)
        if self.on_text is not None:  # generate's own stop_strings end it at a stop: only stream here
            self.seen(new)
        if self.cancel is not None and not self.cancelled and self.cancel():
            self.cancelled = True
        return torch.full((input_ids.shape[0],), self.cancelled, dtype=torch.bool, device=input_ids.device)

    def seen(self, new: list[int]) -> bool:
        """The tokens generated so far: the text they add is streamed; True once a stop string is in it
        (the continuous-batching path stops there; generate's own stop_strings do so on the other)."""
        self.generated = len(new)
        if self.on_text is None and not self.stop:
            return False
        with self.tok_lock:
            text = self.tok.decode(new, skip_special_tokens=True)
        if any(s in text for s in self.stop):  # the final text is cut there: sent at the end
            return True
        if self.on_text is not None:
            safe = text[: len(text) - self.holdback].rstrip("\ufffd")  # not half a character
            self.send(safe)
        return False

    def send(self, text: str) -> None:
        """Send what ``text`` adds to the text sent so far (nothing when it is not an extension)."""
        if self.on_text is not None and len(text) > len(self.sent) and text.startswith(self.sent):
            piece, self.sent = text[len(self.sent) :], text
            self.on_text(piece)


class Engine:
    def __init__(
        self,
        run_dir: str | Path,
        *,
        base_only: bool = False,
        device: str = "auto",
        dtype: str | None = None,
        batching: bool = False,
    ) -> None:
        import torch

        from nbtrain.worker.tuned import load_processor, load_tuned

        self.run_dir = Path(run_dir).resolve()
        self.names = model_names(self.run_dir)
        if base_only:
            del self.names[TUNED]
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self.method = read_json(RunPaths(self.run_dir).resolved)["config"]["method"]
        self.lock = threading.Lock()
        self.tok_lock = threading.Lock()
        self.base_model: Any = None
        self.model, self.tok = load_tuned(self.run_dir, base=base_only, dtype=dtype, device=device)
        self.processor = load_processor(self.run_dir, base=base_only)  # a vision-language model's
        if not base_only and not hasattr(self.model, "disable_adapter"):
            # A full fine-tune replaced the weights: base answers need the base model itself.
            self.base_model, _ = load_tuned(self.run_dir, base=True, dtype=dtype, device=device)
        self.context_length = context_length(self.model, self.tok)
        self.batchers: dict[tuple[str, bool], Batcher] = {}
        self._batchers_lock = threading.Lock()
        self.batching = batching and self._can_batch()
        if self.batching and hasattr(self.model, "disable_adapter"):
            # Continuous batching runs its own loop over a model: base and tuned answers cannot share one
            # by switching the adapter off, so the tuned model is the adapter merged into a copy, and the
            # base the model with its adapter taken out.
            import copy

            peft_model = self.model
            self.model = copy.deepcopy(peft_model).merge_and_unload().eval()
            self.base_model = peft_model.unload().eval()
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        eos = self.tok.eos_token_id if eos is None else eos
        self.eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]

    def _can_batch(self) -> bool:
        """Continuous batching serves text from a plain or LoRA model (a QLoRA model's 4-bit weights do
        not merge exactly, a vision model's images are not batched), where transformers has it;
        NBTRAIN_SERVE_BATCHING=0 turns it off."""
        if os.environ.get("NBTRAIN_SERVE_BATCHING", "1") == "0" or self.processor is not None:
            return False
        return self.method in ("lora", "full") and hasattr(self.model, "init_continuous_batching")

    def _batcher(self, kind: str, sampling: bool) -> Batcher:
        with self._batchers_lock:
            b = self.batchers.get((kind, sampling))
            if b is None:
                with self._model_for(kind) as model:
                    b = Batcher(
                        model,
                        sampling=sampling,
                        pad_token_id=self.tok.pad_token_id,
                        context=self.context_length,
                    )
                self.batchers[(kind, sampling)] = b
            return b

    def close(self) -> None:
        """Stop the batching loops."""
        for b in list(self.batchers.values()):
            b.close()

    # --------------------------------------------------------------------------------- names
    def which(self, model: Any) -> str:
        """TUNED or BASE for a request's ``model`` (its id, or the aliases "tuned" / "base")."""
        if model is None:
            return TUNED if TUNED in self.names else BASE
        for kind, name in self.names.items():
            if isinstance(model, str) and model in (name, kind):
                return kind
        raise RequestError(
            f"model {model!r} is not served here; use one of {', '.join(self.names.values())}",
            "model",
            404,
            "model_not_found",
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

    # ------------------------------------------------------------------------------- prompts
    def chat_prompt(self, messages: Any, params: Params, tools: Any = None) -> Prompt:
        """Check ``messages`` and put them through the chat template; the prompt must leave room.
        ``tools``: the request's (serve/tools.ToolRequest), rendered by the template, the answer begun
        with its ``opening``; messages may carry earlier calls (an assistant's ``tool_calls``) and their
        results (``role: tool``)."""
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list of {role, content} objects", "messages")
        images: list[Any] = []
        msgs: list[dict[str, Any]] = []
        calls = tools is not None
        for i, m in enumerate(messages):
            has_calls = isinstance(m, dict) and m.get("role") == "assistant" and bool(m.get("tool_calls"))
            if (
                not isinstance(m, dict)
                or not isinstance(m.get("role"), str)
                or ("content" not in m and not has_calls)
            ):
                raise RequestError(f"messages[{i}] must be an object with 'role' and 'content'", "messages")
            content = m.get("content")
            if has_calls and content is None:
                content = ""
            if isinstance(content, list):
                content = content_parts(content, f"messages[{i}]", images)
                if self.processor is None:
                    if images:
                        raise RequestError(
                            "this model takes text only: it has no image processor", "messages"
                        )
                    content = "".join(p["text"] for p in content)
            elif not isinstance(content, str):
                raise RequestError(f"messages[{i}].content must be a string or a list of parts", "messages")
            elif self.processor is not None:
                content = [{"type": "text", "text": content}]
            msg = {"role": m["role"], "content": content}
            for key in ("tool_calls", "tool_call_id", "name"):
                if key in m and (key != "name" or m["role"] == "tool"):
                    msg[key] = m[key]
            calls = calls or has_calls or m["role"] == "tool"
            msgs.append(msg)
        self._no_longer_than_the_context_could_hold(
            sum(len(c) if isinstance(c, str) else sum(len(p.get("text") or "") for p in c)
                for c in (m["content"] for m in msgs)),
            "messages",
        )  # fmt: skip
        template_owner = self.processor if self.processor is not None else self.tok
        if not getattr(template_owner, "chat_template", None):
            raise RequestError(
                "this model's tokenizer has no chat template; use /v1/completions with a plain prompt",
                "messages",
            )
        if calls:
            msgs = self._tool_conversation(msgs, tools)
        try:
            with self.tok_lock:
                if self.processor is None:
                    text = self._render(msgs, tools)
                    ids = self.tok(text + (tools.opening if tools else ""), add_special_tokens=False)
                else:
                    ids = self.processor.apply_chat_template(
                        msgs, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
                    )
        except RequestError:
            raise
        except Exception as e:  # noqa: BLE001 - the template (Jinja) refusing the messages is the request's fault
            raise RequestError(f"the model's chat template refused these messages: {e}", "messages") from None
        if self.processor is None:
            return self._fit(list(ids["input_ids"]), params, "messages")
        extra = {k: v for k, v in ids.items() if k not in ("input_ids", "attention_mask")}
        prompt = self._fit(ids["input_ids"][0].tolist(), params, "messages")
        prompt.extra = extra
        return prompt

    def _tool_conversation(self, msgs: list[dict[str, Any]], tools: Any) -> list[dict[str, Any]]:
        """Messages with calls and results checked and put as templates take them (contract/tools)."""
        from nbtrain.contract.errors import RowError
        from nbtrain.contract.tools import conversation

        if self.processor is not None:
            raise RequestError("tools and tool messages are served for text models only", "messages")
        try:
            return conversation(msgs, "messages", tools.tools if tools is not None else [])
        except RowError as e:
            raise RequestError(str(e), "messages") from None

    def _render(self, msgs: list[dict[str, Any]], tools: Any) -> str:
        """The prompt's text (tok_lock held); with tools, a template that leaves them out is refused."""
        if tools is not None and self._tools_missing is not None:
            from nbtrain.contract.tools import TEMPLATE_FIX

            raise RequestError(
                f"this model's chat template does not render {self._tools_missing}, so the model could "
                f"not know the tools; {TEMPLATE_FIX}; or leave tools out",
                "tools",
            )
        extra = {"tools": tools.tools} if tools is not None else {}
        return str(self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **extra))

    @functools.cached_property
    def _tools_missing(self) -> str | None:
        """What of a tool-calling conversation this model's template leaves out (contract/tools' probe,
        the worker's check of tool rows), rendered once per server; None when it keeps both."""
        from nbtrain.contract.tools import probe_conversation, tools_left_out

        messages, tools = probe_conversation()
        try:
            return tools_left_out(str(self.tok.apply_chat_template(messages, tools=tools, tokenize=False)))
        except Exception as e:  # noqa: BLE001 - any failure of the template on tools is the answer
            return f"a tool-calling conversation ({type(e).__name__})"

    @property
    def call_style(self) -> str | None:
        """How this model's template writes tool calls (contract/tools.CALL_STYLES), or None."""
        from nbtrain.contract.tools import call_style

        template = getattr(self.tok, "chat_template", None)
        return call_style(template if isinstance(template, str) else None)

    def _no_longer_than_the_context_could_hold(
        self, chars: int, what: str, param: str | None = None, fix: str = "Please shorten it."
    ) -> None:
        """A prompt with more characters than the context could hold as tokens (CHARS_PER_TOKEN_AT_MOST
        each, a generous bound) is refused before the tokenizer reads it: a 7.7 MB prompt held the
        tokenizer, and every other request, for 29 s only to be refused after."""
        most = self.context_length * CHARS_PER_TOKEN_AT_MOST
        if chars > most:
            raise RequestError(
                f"This model's maximum context length is {self.context_length} tokens; the {what} "
                f"{'have' if what.endswith('s') else 'has'} {chars} characters, more than that many tokens "
                f"could hold (at most {most}). {fix}",
                param or what,
                code="context_length_exceeded",
            )

    def text_prompts(self, prompts: list[Any], params: Params) -> list[Prompt]:
        """A completion request's prompts (a string, or a list of them), bounded as one chat's messages
        are: their characters together checked before any is tokenized, their tokens together at most the
        context length (each counts at least one: an empty prompt still costs a generation), so a list of
        100k one-word prompts is one 400, not minutes of tokenizing and generating."""
        if not all(isinstance(p, str) for p in prompts):
            raise RequestError("prompt must be a string or a non-empty list of strings", "prompt")
        chars = sum(map(len, prompts))
        if len(prompts) == 1:
            self._no_longer_than_the_context_could_hold(chars, "prompt")
        else:
            self._no_longer_than_the_context_could_hold(
                chars, f"{len(prompts)} prompts", "prompt", "Please send them in several requests."
            )
        out: list[Prompt] = []
        tokens = 0
        for text in prompts:
            out.append(self.text_prompt(text, params))
            tokens += max(1, len(out[-1].ids))
            if len(prompts) > 1 and tokens > self.context_length:
                raise RequestError(
                    f"This model's maximum context length is {self.context_length} tokens; the "
                    f"{len(prompts)} prompts of this request hold more than that together (over {tokens} "
                    f"tokens in the first {len(out)}). A request's prompts together fit one context, as a "
                    f"chat's messages do: send them in several requests.",
                    "prompt",
                    code="context_length_exceeded",
                )
        return out

    def text_prompt(self, prompt: Any, params: Params) -> Prompt:
        if not isinstance(prompt, str):
            raise RequestError("prompt must be a string or a non-empty list of strings", "prompt")
        self._no_longer_than_the_context_could_hold(len(prompt), "prompt")
        with self.tok_lock:
            ids = self.tok(prompt, add_special_tokens=True)["input_ids"]
        return self._fit(list(ids), params, "prompt")

    def _fit(self, ids: list[int], params: Params, what: str) -> Prompt:
        ctx, n = self.context_length, len(ids)
        if params.max_tokens is None:
            if n < ctx:
                return Prompt(ids, min(DEFAULT_MAX_TOKENS, ctx - n))
            asked = f"{n} tokens in the {what}, and at least 1 for the completion"
        elif n + params.max_tokens <= ctx:
            return Prompt(ids, params.max_tokens)
        else:
            asked = (
                f"{n + params.max_tokens} tokens ({n} in the {what}, {params.max_tokens} for the completion)"
            )
        raise RequestError(
            f"This model's maximum context length is {ctx} tokens. However, you requested {asked}. "
            f"Please reduce the length of the {what} or max_tokens.",
            what if params.max_tokens is None else "max_tokens",
            code="context_length_exceeded",
        )

    def _on_device(self, value: Any) -> Any:
        """A processor's tensor on the model's device; pixel values in the model's dtype (bf16 on a GPU)."""
        if not hasattr(value, "to"):
            return value
        if value.is_floating_point():
            return value.to(self.device, dtype=self.model.get_input_embeddings().weight.dtype)
        return value.to(self.device)

    # ---------------------------------------------------------------------------- generation
    def chat(self, messages: Any, kind: str, params: Params) -> Output:
        return self.generate(self.chat_prompt(messages, params), kind, params)

    def complete(self, prompt: Any, kind: str, params: Params) -> Output:
        return self.generate(self.text_prompt(prompt, params), kind, params)

    def generate(
        self,
        prompt: Prompt,
        kind: str,
        params: Params,
        *,
        cancel: Callable[[], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
        special: bool = False,
    ) -> Output:
        """The completion of ``prompt``. ``cancel``: checked while waiting and after every token; when
        it returns True generation stops and Cancelled is raised. ``on_text``: called with each new
        piece of text as it is generated (streaming); the pieces add up to the returned text. ``special``:
        the returned text keeps the special tokens other than end, padding and start (a tool call's
        marker may be one)."""
        import torch
        from transformers import StoppingCriteriaList

        input_ids, max_tokens = prompt.ids, prompt.max_tokens
        watch = _Watch(self.tok, self.tok_lock, len(input_ids), params.stop, cancel, on_text)
        sampling = params.temperature >= MIN_TEMPERATURE
        if self.batching and not prompt.extra and not (sampling and params.seed is not None):
            # together with whatever else is being answered (a seeded sample takes the path below: the
            # batch's sampler has no per-request random state)
            if cancel is not None and cancel():
                raise Cancelled(0, max_tokens)
            batcher = self._batcher(kind, sampling)
            got = batcher.generate(
                input_ids, max_tokens=max_tokens, eos=self.eos_ids, temperature=params.temperature,
                top_p=params.top_p, on_tokens=watch.seen, cancel=cancel,
            )  # fmt: skip
            if cancel is not None and not got.finished and cancel():
                raise Cancelled(len(got.tokens), max_tokens)
            return self._output(got.tokens, input_ids, max_tokens, params, special, watch)
        ids = torch.tensor([input_ids], device=self.device)
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "pad_token_id": self.tok.pad_token_id,
            "attention_mask": torch.ones_like(ids),
            "stopping_criteria": StoppingCriteriaList([watch]),
            **{k: self._on_device(v) for k, v in prompt.extra.items()},
        }
        if params.temperature >= MIN_TEMPERATURE:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if params.stop:
            kwargs.update(stop_strings=params.stop, tokenizer=self.tok)
        while not self.lock.acquire(timeout=0.1):  # another request is generating
            if cancel is not None and cancel():
                raise Cancelled(0, max_tokens)
        try:
            if cancel is not None and cancel():  # left while waiting: start nothing
                raise Cancelled(0, max_tokens)
            with torch.inference_mode(), self._model_for(kind) as model:
                if params.seed is not None:
                    torch.manual_seed(params.seed)
                out = model.generate(input_ids=ids, **kwargs)
        finally:
            self.lock.release()
        new = out[0, len(input_ids) :].tolist()
        if watch.cancelled:
            raise Cancelled(len(new), max_tokens)
        return self._output(new, input_ids, max_tokens, params, special, watch)

    def _output(
        self,
        new: list[int],
        input_ids: list[int],
        max_tokens: int,
        params: Params,
        special: bool,
        watch: _Watch,
    ) -> Output:
        """The answer of ``new`` tokens: its text (cut at a stop string), why it ended, its counts."""
        with self.tok_lock:
            if special:
                ends = {self.tok.eos_token_id, self.tok.pad_token_id, self.tok.bos_token_id}
                text = self.tok.decode([t for t in new if t not in ends], skip_special_tokens=False)
            else:
                text = self.tok.decode(new, skip_special_tokens=True)
        finish = "length" if len(new) >= max_tokens else "stop"
        for s in params.stop or []:
            cut = text.find(s)
            if cut >= 0:
                text, finish = text[:cut], "stop"
        eos = self.tok.eos_token_id
        if new and new[-1] == eos:
            finish = "stop"
        watch.send(text)
        return Output(text, finish, len(input_ids), len(new))
