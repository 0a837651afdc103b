"""Request handlers: ``async def handle(ctx: RequestContext, req) -> dict`` (the reply body), one per
v3 request type; the one table is ``server.handlers.dispatch.HANDLERS``."""
