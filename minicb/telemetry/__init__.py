"""Telemetry: what is made of the events the engine publishes on its bus (both in
minicb/core): each request's record of its times (the one collector of them,
request_times.py), metrics, Prometheus (with the requests' latencies), traces (written,
read, exported to Perfetto, one file per engine), events as JSON and the KV map they draw.
Pure Python except Prometheus' client."""
