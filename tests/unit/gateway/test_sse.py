from __future__ import annotations

import random

from gateway.proxy.sse import SSESplitter, inspect_event


def _earliest_terminator_events(data: bytes) -> tuple[list[bytes], bytes]:
    """The rule, byte by byte: each event ends at the earliest `\n\n` or `\r\n\r\n`."""
    events, start, i = [], 0, 0
    while i < len(data):
        for term in (b"\n\n", b"\r\n\r\n"):
            if data.startswith(term, i):
                events.append(data[start : i + len(term)])
                start = i = i + len(term)
                break
        else:
            i += 1
    return events, data[start:]


def test_any_chunking_of_any_mix_of_terminators_gives_the_rules_events() -> None:
    rng = random.Random(7)
    for _ in range(500):
        data = bytes(rng.choice(b"ab\r\n") for _ in range(rng.randrange(0, 40)))
        cuts = sorted(rng.sample(range(len(data) + 1), k=min(len(data) + 1, rng.randrange(0, 5))))
        splitter, got = SSESplitter(), []
        for lo, hi in zip([0, *cuts], [*cuts, len(data)], strict=True):
            got += splitter.feed(data[lo:hi])
        assert (got, splitter.remainder()) == _earliest_terminator_events(data), data


def test_splitter_handles_events_across_chunks_and_both_terminators() -> None:
    splitter = SSESplitter()
    assert splitter.feed(b"data: 1\n") == []
    assert splitter.feed(b"\ndata: 2\r\n\r\nda") == [b"data: 1\n\n", b"data: 2\r\n\r\n"]
    assert splitter.feed(b"ta: 3\n\n") == [b"data: 3\n\n"]
    assert splitter.remainder() == b""
    splitter.feed(b"data: partial")
    assert splitter.remainder() == b"data: partial"


def test_role_chunk_has_no_content_but_a_token_does() -> None:
    role = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
    token = b'data: {"choices":[{"delta":{"content":" hi"}}]}\n\n'
    text = b'data: {"choices":[{"text":"x"}]}\n\n'
    assert not inspect_event(role, need_content=True).has_content
    assert inspect_event(token, need_content=True).has_content
    assert inspect_event(text, need_content=True).has_content


def test_usage_only_chunk_and_done() -> None:
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n'
    info = inspect_event(usage, need_content=False)
    assert info.usage_only and info.usage == {"prompt_tokens": 1, "completion_tokens": 2}
    assert inspect_event(b"data: [DONE]\n\n", need_content=False).is_done


def test_fast_path_skips_parsing_after_first_content() -> None:
    token = b'data: {"choices":[{"delta":{"content":" hi"}}]}\n\n'
    assert not inspect_event(token, need_content=False).has_content


def test_garbage_is_inert() -> None:
    for event in (b": keepalive\n\n", b"data: {oops\n\n", b"data: [1]\n\n", b"event: x\n\n"):
        info = inspect_event(event, need_content=True)
        assert not info.has_content and info.usage is None and not info.is_done
