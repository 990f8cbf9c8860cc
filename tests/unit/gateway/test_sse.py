from __future__ import annotations

from gateway.proxy.sse import SSESplitter, inspect_event


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
