"""One-shot generation without a server:

    python -m nbtrain.worker.serve.generate RUN_DIR REQUEST.json RESULT.json


REQUEST.json: {"prompts": [str | [{"role", "content"}, ...]], "chat": bool, "base": bool, "device": str,
"params": {max_tokens, temperature, top_p, seed, stop}, "tools"?: [function schemas]}. Writes {"outputs":
[str, ...]} (with tools: the assistant messages, as the server answers them) or {"error": str} to
RESULT.json; the process's own output is only logs. Used by ``Run.generate`` and ``chat_with_tools`` when
no server is up.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from nbtrain.contract.rundir import atomic_write_json
from nbtrain.worker.serve.engine import BASE, TUNED, Engine
from nbtrain.worker.serve.request import Params, RequestError
from nbtrain.worker.serve.tools import ToolRequest, message


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3:
        print(
            "usage: python -m nbtrain.worker.serve.generate RUN_DIR REQUEST.json RESULT.json", file=sys.stderr
        )
        return 2
    req = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    try:
        params = Params.from_request(req.get("params") or {})
        engine = Engine(argv[0], base_only=bool(req.get("base")), device=req.get("device", "auto"))
        kind = BASE if req.get("base") else TUNED
        outputs: list[Any] = []
        tools = (
            ToolRequest.from_body({"tools": req["tools"]}, engine.call_style) if req.get("tools") else None
        )
        for p in req["prompts"]:
            if tools is not None:
                out = engine.generate(engine.chat_prompt(p, params, tools), kind, params, special=True)
                outputs.append(message(tools.read(out.text), tools.opening + out.text)[0])
            elif req.get("chat", True):
                msgs = [{"role": "user", "content": p}] if isinstance(p, str) else p
                outputs.append(engine.chat(msgs, kind, params).text)
            else:
                outputs.append(engine.complete(p, kind, params).text)
    except RequestError as e:
        atomic_write_json(Path(argv[2]), {"error": str(e)})
        return 1
    atomic_write_json(Path(argv[2]), {"outputs": outputs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
