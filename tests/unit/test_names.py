def test_queue_label_names_a_catalog_queue_or_nothing():
    from kbroker.core.names import queue_label, queue_topic, secondary_queue_topic, transmission_topic

    queues = {"Orders", "a.b"}
    assert queue_label("ns", queue_topic("ns", "Orders"), queues) == "Orders"
    assert queue_label("ns", secondary_queue_topic("ns", "Orders", "instance-7"), queues) == "Orders"
    assert queue_label("ns", queue_topic("ns", "a.b"), queues) == "a.b"  # a dotted queue name stays whole
    assert queue_label("ns", transmission_topic("ns"), queues) == ""  # routed: another namespace's queue
    assert queue_label("ns", queue_topic("ns", "Gone"), queues) == ""  # not in the catalog: no new label
    assert queue_label("ns", queue_topic("other", "Orders"), queues) == ""
