"""The garbage collector of a serving process, set once the app has started.

`tune_collector()` is called by the runner (`gateway.uvicorn_runner.serve`) right after the lifespan
start-up, before the first request, and nowhere else: a process that embeds the app (the tests) keeps
the interpreter's settings.

- **Freeze what start-up built.** `gc.collect()` then `gc.freeze()`: the modules, settings, metrics,
  routers and the app, alive for the whole process, move to the permanent generation, which no
  collection walks. A full (generation-2) collection then costs what was allocated since start-up,
  not the whole heap, so its pause does not grow with the size of the installed libraries. A frozen
  object is still freed when its last reference goes; only a reference cycle among frozen objects
  would never be collected, which is why only what start-up built, kept for the process, is frozen.
- **Collect the youngest generation less often** (`YOUNG_THRESHOLD` container allocations net of
  deallocations instead of the interpreter's 700): every young collection promotes the objects of the
  requests in flight, which then count towards the next full collection although they die a moment
  later; the fewer young collections, the fewer such promotions and full collections. A young
  collection walks about as many objects as the threshold, so the threshold also bounds its pause.
  The older generations keep the interpreter's thresholds.

The choice and its measurement (`python -m bench.gc_pauses`, the pauses of every generation and a
`/healthz` probe under a closed-loop load, for the interpreter's settings, the freeze alone, and both)
are in docs/BENCHMARKS.md, "Per-request leftovers and GC pauses".
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Generation-0 threshold: net container allocations between two young collections."""


def tune_collector() -> None:
    """Collect, freeze the survivors, and set the young generation's threshold (module docstring)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
