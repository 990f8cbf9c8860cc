"""Running one generation on the mock engine and answering it, for every API family that generates (the
OpenAI completions, the Anthropic Messages API, the Responses API).

`GenerationRunner.run` counts the request in `RequestCounters` (`started`, `active`, `max_active`, then
`finished` or `aborted`), streams or completes it in the wire's format (`GenerationRun`), and aborts it
in the engine when it does not finish: the client left (counted in `aborted`), an injected crash
(re-raised), or an interruption. On a disaggregated engine the request's leg ends with the outcome
(`DisaggRole.end`), a failure whatever went wrong.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from mock_engine.asgi import ClientGone, InjectedCrash, Receive, Send, wait_disconnect
from mock_engine.disagg_role import DisaggRole, Leg
from mock_engine.driver import EngineDriver
from mock_engine.faults import FaultPlan
from mock_engine.generation import Generation
from mock_engine.streaming import GenerationRun, RequestCounters, Wire


class GenerationRunner:
    """Runs generations on `driver`; `model_name(adapter)` is the model name an answer carries."""

    def __init__(
        self,
        driver: EngineDriver,
        counters: RequestCounters,
        disagg: DisaggRole | None,
        *,
        model_name: Callable[[str | None], str],
        shutting_down: Callable[[], bool],
    ) -> None:
        self.driver = driver
        self.counters = counters
        self.disagg = disagg
        self._model_name = model_name
        self._shutting_down = shutting_down

    async def run(
        self,
        gen: Generation,
        plan: FaultPlan,
        receive: Receive,
        send: Send,
        *,
        stream: bool,
        leg: Leg | None = None,
        answer: dict[str, Any] | None = None,
        wire: Wire | None = None,
    ) -> str:
        """Run `gen` on the engine and answer it (streamed or whole) in `wire`'s format (default OpenAI,
        with `answer` fields); counts it and aborts it in the engine when the client leaves. Returns the
        outcome (`finished`, `crashed`, `aborted`)."""
        leg = leg or Leg()
        c = self.counters
        c.started += 1
        c.active += 1
        c.max_active = max(c.max_active, c.active)
        watcher = asyncio.create_task(wait_disconnect(receive))
        run = GenerationRun(
            self.driver,
            gen,
            plan,
            model=self._model_name(gen.adapter),
            counters=c,
            receive=receive,
            watcher=watcher,
            shutting_down=self._shutting_down,
            answer_fields=answer,
            wire=wire,
        )
        outcome = "aborted"
        try:
            outcome = await (run.stream(send) if stream else run.complete(send))
            if self.disagg is not None:
                self.disagg.end(leg, outcome == "finished")
            if outcome == "finished":
                c.finished += 1
            else:
                self.driver.abort(gen.request_id)
        except ClientGone:
            c.aborted += 1
            self.driver.abort(gen.request_id)
        except InjectedCrash:
            self.driver.abort(gen.request_id)
            raise
        finally:
            if self.disagg is not None and outcome != "finished":
                self.disagg.end(leg, False)
            watcher.cancel()
            c.active -= 1
            self.driver.finish(gen.request_id)
        return outcome
