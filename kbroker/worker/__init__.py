"""The worker's pure logic: queue monitors, the cluster tick, polling ramp-up, dispatcher sweeps.

Nothing here does I/O or reads the clock; the Faust adapter feeds events and `now` in.
"""
