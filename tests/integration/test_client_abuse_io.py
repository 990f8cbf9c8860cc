"""`ClientIO`, the proxy endpoints' side of a client's connection, against fake ASGI callables: the
declared length checked before the body, the body deadline, and the write deadline (`WriteDeadlines`:
one timer for every send under way)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.api.asgi_io import CONNECTION_EXTENSION, ClientIO, ClientWriteTimeout, Message
from gateway.api.write_deadline import WriteDeadlines
from gateway.base.errors import PayloadTooLarge, RequestTimeout

BODY = {"type": "http.response.body", "body": b"x", "more_body": True}


class Control:
    def __init__(self) -> None:
        self.aborted = 0

    def abort(self) -> None:
        self.aborted += 1


def _io(send: Any, headers: list[tuple[bytes, bytes]] | None = None, receive: Any = None) -> ClientIO:
    scope = {"headers": headers or [(b"content-length", b"2")], "extensions": {CONNECTION_EXTENSION: CONTROL}}
    return ClientIO(scope, receive, send, deadlines=WriteDeadlines(0.2), on_timeout=PHASES.append)


CONTROL = Control()
PHASES: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    CONTROL.aborted = 0
    PHASES.clear()


def test_a_send_the_client_does_not_take_ends_at_the_deadline_and_drops_the_connection() -> None:
    async def stuck(message: Message) -> None:
        await asyncio.Event().wait()

    async def run() -> float:
        io = _io(stuck)
        started = time.monotonic()
        with pytest.raises(ClientWriteTimeout):
            await io.send(BODY)
        await io.send(BODY)  # later sends do nothing
        return time.monotonic() - started

    elapsed = asyncio.run(run())
    assert 0.2 <= elapsed < 0.5 and PHASES == ["write"] and CONTROL.aborted == 1


def test_many_quick_sends_over_longer_than_the_deadline_do_not_expire() -> None:
    async def quick(message: Message) -> None:
        await asyncio.sleep(0.01)

    async def run() -> None:
        io = _io(quick)
        for _ in range(50):  # 0.5 s of sending, each send well within 0.2 s
            await io.send(BODY)

    asyncio.run(run())
    assert PHASES == [] and CONTROL.aborted == 0


def test_another_cancellation_during_a_send_stays_a_cancellation() -> None:
    async def stuck(message: Message) -> None:
        await asyncio.Event().wait()

    async def run() -> None:
        task = asyncio.create_task(_io(stuck).send(BODY))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert PHASES == [] and CONTROL.aborted == 0


def test_an_answer_before_the_body_was_read_closes_the_connection() -> None:
    sent: list[Message] = []

    async def record(message: Message) -> None:
        sent.append(message)

    async def run() -> None:
        start = {"type": "http.response.start", "status": 401, "headers": []}
        await _io(record).send(start)
        await _io(record, headers=[(b"content-length", b"0")]).send(start)
        plain = ClientIO(
            {"headers": [(b"content-length", b"2")]},
            None,
            record,
            deadlines=WriteDeadlines(1),
            on_timeout=print,
        )
        await plain.send(start)  # a server without the lingering close discards the rest itself

    asyncio.run(run())
    assert (b"connection", b"close") in sent[0]["headers"]
    assert sent[1]["headers"] == [] and sent[2]["headers"] == []


def test_the_declared_length_is_refused_before_any_of_the_body_is_read() -> None:
    async def never(*args: Any) -> Message:
        raise AssertionError("the body was read")

    async def run() -> None:
        io = _io(None, headers=[(b"content-length", b"10000000000")], receive=never)
        with pytest.raises(PayloadTooLarge, match="10000000000"):
            await io.read_body(4096, 1.0)

    asyncio.run(run())


def test_a_body_that_does_not_arrive_in_time_is_a_request_timeout() -> None:
    async def trickle() -> Message:
        await asyncio.sleep(0.05)
        return {"type": "http.request", "body": b"x", "more_body": True}

    async def run() -> None:
        io = _io(None, receive=trickle)
        with pytest.raises(RequestTimeout):
            await io.read_body(4096, 0.2)
        assert not io.body_complete

    asyncio.run(run())
    assert PHASES == ["body"]
