"""The worker's HTTP API: the dashboard, the JSON pages, /metrics, the gate in front of them, and a client for them."""
