"""The worker (`kbroker worker`): the Faust app that runs a namespace's queue monitors, activated
readers, cluster tick, timer service and routing, and serves its HTTP pages and dashboard.

This package is the Faust adapter, so it does I/O: app.py builds the app and wires the services
(monitors.py, tick.py, watch.py, control.py, pages.py, dashboard.py), which talk to Kafka through
kafka/ and sdk/. The decisions they carry out (monitor steps, tick numbers, polling ramp-up,
dispatcher sweeps) are pure logic in core/, fed events and `now` from here.
"""
