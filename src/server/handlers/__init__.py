"""Request handlers: ``async def handle(ctx: RequestContext, req) -> Reply`` (``req`` the typed request of
``protocol.messages``, the reply a typed ``protocol.replies`` object), one per v3 request type; the one
table is ``server.handlers.dispatch.HANDLERS``."""
