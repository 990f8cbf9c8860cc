import pytest

from admission.fair_share import FairShareQueue


def drain(queue: FairShareQueue) -> list[int]:
    order = []
    while (key := queue.pop()) is not None:
        order.append(key)
    return order


def test_single_tenant_is_fifo() -> None:
    queue = FairShareQueue()
    for key, cost in enumerate([500, 10, 3000, 1]):
        queue.push(key, "a", cost)
    assert drain(queue) == [0, 1, 2, 3]


def test_light_tenant_is_not_starved_by_a_heavy_flood() -> None:
    queue = FairShareQueue()
    for key in range(100):
        queue.push(key, "heavy", 4000)
    for key in range(100, 105):
        queue.push(key, "light", 100)
    order = drain(queue)
    # all five short requests go out before the second long one (tags 100..500 < 8000)
    assert order[:6] == [100, 101, 102, 103, 104, 0]


def test_late_light_arrival_waits_for_at_most_one_heavy_request() -> None:
    queue = FairShareQueue()
    for key in range(50):
        queue.push(key, "heavy", 4000)
    assert [queue.pop() for _ in range(3)] == [0, 1, 2]
    queue.push(1000, "light", 100)
    assert queue.pop() == 1000


def test_weights_share_tokens_proportionally_while_backlogged() -> None:
    queue = FairShareQueue()
    for key in range(0, 200, 2):
        queue.push(key, "gold", 1000, weight=2.0)
        queue.push(key + 1, "bronze", 1000, weight=1.0)
    first_90 = [queue.pop() for _ in range(90)]
    gold = sum(1 for key in first_90 if key is not None and key % 2 == 0)
    assert gold == 60  # 2:1


def test_idle_tenant_earns_no_credit() -> None:
    queue = FairShareQueue()
    for key in range(10):
        queue.push(key, "a", 100)
    for _ in range(5):
        queue.pop()
    assert queue.virtual_time == 500
    finish_tag = queue.push(99, "b", 100)
    assert finish_tag == 600  # starts at V, not at 0


def test_remove_is_lazy_and_forgives_unserved_cost() -> None:
    queue = FairShareQueue()
    queue.push(1, "a", 1000)
    queue.push(2, "a", 1000)
    queue.push(3, "b", 10)
    assert queue.remove(1)
    assert not queue.remove(1)
    assert 1 not in queue
    assert queue.tenant_queued("a") == 1
    assert drain(queue) == [3, 2]


def test_removing_last_entry_of_a_tenant_resets_its_tag() -> None:
    queue = FairShareQueue()
    queue.push(1, "a", 1000)
    queue.push(2, "b", 10)
    queue.remove(1)
    assert queue.tenant_queued("a") == 0
    assert queue.push(3, "a", 10) == 10  # starts at V = 0 again


def test_virtual_time_resets_when_empty() -> None:
    queue = FairShareQueue()
    queue.push(1, "a", 100)
    assert queue.pop() == 1
    assert queue.virtual_time == 0.0
    assert len(queue) == 0
    assert queue.pop() is None


def test_zero_cost_still_advances_the_tag() -> None:
    queue = FairShareQueue()
    assert queue.push(1, "a", 0) == 1.0
    assert queue.push(2, "a", 0) == 2.0


def test_heap_is_compacted_after_many_removals() -> None:
    queue = FairShareQueue()
    for key in range(200):
        queue.push(key, f"t{key % 3}", 10 + key)
    for key in range(200):
        if key % 4 != 3:
            queue.remove(key)
    assert len(queue) == 50
    assert len(queue._heap) <= 2 * len(queue)
    assert sorted(drain(queue)) == [k for k in range(200) if k % 4 == 3]


@pytest.mark.parametrize(
    ("key", "cost", "weight"),
    [(2, 10, 0.0), (2, 10, -1.0), (2, -1, 1.0), (1, 10, 1.0)],
)
def test_invalid_pushes_raise(key: int, cost: float, weight: float) -> None:
    queue = FairShareQueue()
    queue.push(1, "a", 10)
    with pytest.raises(ValueError):
        queue.push(key, "a", cost, weight)


def test_an_arrival_is_placed_after_the_keys_with_smaller_tags_only() -> None:
    queue = FairShareQueue()
    for key in range(10):
        queue.push(key, "flood", 100)
    assert queue.ahead_of_arrival("flood", 100) == 10, "the flooding tenant waits behind its own backlog"
    assert queue.ahead_of_arrival("newcomer", 100) == 1, "an idle tenant starts at V: behind one of them"
    assert queue.ahead_of_arrival("heavy-weight", 100, weight=4) == 0
    assert len(queue) == 10, "asking changes nothing"


def test_a_key_pushed_first_goes_ahead_of_the_backlog_fifo_among_such_keys() -> None:
    queue = FairShareQueue()
    for key in range(5):
        queue.push(key, "a", 100)
    assert queue.pop() == 0
    assert queue.ahead_of_arrival("b", 100, first=True) == 0
    queue.push(10, "b", 100, first=True)
    queue.push(11, "a", 100, first=True)
    assert queue.ahead_of_arrival("c", 100, first=True) == 2, "behind the two pushed first"
    assert queue.ahead_of_arrival("a", 100) == 6, "a fresh key of a queues behind everything of its own"
    assert drain(queue) == [10, 11, 1, 2, 3, 4]


def test_a_key_pushed_first_is_still_charged_to_its_tenant() -> None:
    queue = FairShareQueue()
    queue.push(0, "heavy", 4000)
    queue.push(1, "light", 100)
    queue.push(2, "heavy", 4000, first=True)  # ahead now, but heavy's next key pays for it
    queue.push(3, "heavy", 100)
    queue.push(4, "light", 100)
    assert drain(queue) == [2, 1, 4, 0, 3]
