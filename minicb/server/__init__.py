"""The server: engines in their own thread, FastAPI routes and WebSockets around them."""
