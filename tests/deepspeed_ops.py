"""Build DeepSpeed's CPU ops (CPU Adam, the shared-memory collectives, async I/O and pinned memory for
offload: nvme) into TORCH_EXTENSIONS_DIR before the tests that use them start, so no test pays a build of
minutes in its own time. ``make test`` starts it in the background at the lowest CPU priority; a test that
needs an op meanwhile waits on torch's build lock and then loads the finished build. Each op is built as
DeepSpeed itself loads it on this machine's accelerator (the same flags, so the same cache entry); an op
that cannot build here (no libaio) is skipped, saying why.

    python -m tests.deepspeed_ops
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    failed = 0
    for name in ("CPUAdamBuilder", "ShareMemCommBuilder", "AsyncIOBuilder", "PinMemoryBuilder"):
        builder = get_accelerator().create_op_builder(name)
        if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            print(f"{name}: not built (not compatible here)", flush=True)
            continue
        t = time.monotonic()
        try:
            builder.load(verbose=False)
        except Exception as e:  # said; the test that needs the op reports it again
            failed += 1
            print(f"{name}: build failed: {type(e).__name__}: {e}", flush=True)
            continue
        print(f"{name}: ready in {time.monotonic() - t:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
