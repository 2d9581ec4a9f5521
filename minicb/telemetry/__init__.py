"""Telemetry: the events the engine publishes, the bus that carries them, and what is
made of them (metrics, Prometheus, traces). Pure Python except Prometheus' client."""
