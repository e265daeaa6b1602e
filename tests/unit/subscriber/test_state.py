"""What `txrepl subscriber status` shows of a subscription's errors."""

from __future__ import annotations

from subscriber.state import SubscriptionState


def test_an_error_is_shown_until_the_subscription_is_in_sync_again() -> None:
    st = SubscriptionState("s1", level=3, incarnation="inc")
    st.fail("error", "connection refused by 127.0.0.1:5")
    assert st.status("p", "pub").last_error == "connection refused by 127.0.0.1:5"
    st.set("syncing", "reconnected")
    assert st.status("p", "pub").last_error == "connection refused by 127.0.0.1:5"
    st.in_sync_head = 3
    st.enter_in_sync()
    status = st.status("p", "pub")
    assert (status.state, status.last_error) == ("in_sync", "")
    # the timeline still tells what happened
    assert [t.reason for t in status.timeline if t.state == "error"] == [
        "connection refused by 127.0.0.1:5"
    ]
