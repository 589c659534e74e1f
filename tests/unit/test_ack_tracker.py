from cdc.lsn import Lsn
from cdc.sink.kafka import AckTracker


def test_nothing_is_acknowledged_before_delivery():
    t = AckTracker(Lsn(100))
    e = t.begin()
    e.pending += 2
    t.commit(e, Lsn(200))
    assert t.acknowledged() == 100
    e.pending -= 1
    assert t.acknowledged() == 100
    e.pending -= 1
    assert t.acknowledged() == 200


def test_an_open_transaction_is_never_confirmed_even_when_its_records_are_delivered():
    t = AckTracker()
    e = t.begin()
    e.pending = 0
    assert t.acknowledged() == 0


def test_a_later_transaction_acknowledged_first_waits_for_the_earlier_one():
    t = AckTracker()
    first, second = t.begin(), t.begin()
    first.pending, second.pending = 1, 1
    t.commit(first, Lsn(10))
    t.commit(second, Lsn(20))
    second.pending = 0
    assert t.acknowledged() == 0
    first.pending = 0
    assert t.acknowledged() == 20


def test_keepalive_position_is_confirmed_at_once_when_idle():
    t = AckTracker(Lsn(5))
    t.position(Lsn(50))
    assert t.acknowledged() == 50
    assert t.idle


def test_keepalive_position_waits_behind_pending_transactions():
    t = AckTracker()
    e = t.begin()
    e.pending = 1
    t.commit(e, Lsn(10))
    t.position(Lsn(99))
    assert t.acknowledged() == 0
    e.pending = 0
    assert t.acknowledged() == 99


def test_a_failure_freezes_the_acknowledged_position():
    t = AckTracker()
    e = t.begin()
    t.commit(e, Lsn(10))
    assert t.acknowledged() == 10
    bad = t.begin()
    bad.pending = 1
    t.commit(bad, Lsn(20))
    t.fail("delivery failed")
    bad.pending = 0
    t.position(Lsn(30))
    assert t.acknowledged() == 10


def test_acknowledged_never_moves_backwards():
    t = AckTracker(Lsn(100))
    e = t.begin()
    t.commit(e, Lsn(50))
    assert t.acknowledged() == 100
