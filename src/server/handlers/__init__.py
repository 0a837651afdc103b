"""Request handlers: one coroutine per v3 request type; the table lives in server.handlers.dispatch."""
