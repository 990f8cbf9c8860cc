"""The write watch's rule (gateway/api/write_watch.py): a stalled client and a slow reader are cut."""

from gateway.api.write_watch import WriteWatch


def test_bytes_waiting_with_nothing_acknowledged_for_the_deadline_is_a_write_timeout() -> None:
    watch = WriteWatch(write_timeout_s=4.0)
    watch.restart(0.0)
    assert watch.sample(1.0, acked=100, in_flight=10, unsent=0, buffered=0) is None
    assert watch.sample(4.9, acked=100, in_flight=10, unsent=0, buffered=0) is None
    assert watch.sample(5.0, acked=100, in_flight=10, unsent=0, buffered=0) == "write"


def test_nothing_waiting_is_progress_however_long() -> None:
    watch = WriteWatch(write_timeout_s=4.0)
    watch.restart(0.0)
    for t in range(1, 20):
        assert watch.sample(float(t), acked=100, in_flight=0, unsent=0, buffered=0) is None


def test_a_reader_under_the_minimum_rate_while_the_kernel_holds_bytes_is_cut() -> None:
    watch = WriteWatch(write_timeout_s=4.0, min_read_bytes_per_s=1024)
    watch.restart(0.0)
    acked = 0
    verdicts = []
    for t in range(1, 12):
        acked += 500  # 500 B/s, acknowledged at every sample: never a write timeout
        verdicts.append(watch.sample(float(t), acked=acked, in_flight=100, unsent=8000, buffered=0))
    assert "slow_read" in verdicts and "write" not in verdicts


def test_a_client_keeping_up_with_a_slow_engine_is_never_a_slow_reader() -> None:
    watch = WriteWatch(write_timeout_s=4.0, min_read_bytes_per_s=1024)
    watch.restart(0.0)
    for t in range(1, 30):  # 50 B/s, but the kernel holds nothing unsent: the engine is the limit
        assert watch.sample(float(t), acked=50 * t, in_flight=50, unsent=0, buffered=0) is None
