"""Model choices: the configured models merged with the endpoint's GET /models, cached, never waited on."""
from __future__ import annotations


from server.agent.model_catalog import ModelCatalog, merge_models
from testkit.server import poll


def test_merge_keeps_the_configured_order_then_sorted_new_ids():
    assert merge_models(["b", "a", "b"], ["z", "a", "c", "", 3, "x" * 500], 10) == ["b", "a", "c", "z"]
    assert merge_models(["a"], ["c", "b", "d"], 2) == ["a", "b", "c"]


async def test_agent_offers_the_endpoint_models_after_a_background_refresh(llm, make_agent):
    llm.models = ["scripted-model", "remote-1", "alt-1", "remote-0"]
    agent = make_agent(models=["alt-1"])
    assert agent.models() == ["scripted-model", "alt-1"]            # at once, from the config
    await poll(lambda: len(agent.models()) == 4)
    assert agent.models() == ["scripted-model", "alt-1", "remote-0", "remote-1"]
    assert len(llm.model_requests) == 1 and llm.model_requests[0].path == "/v1/models"
    assert agent.models() and len(llm.model_requests) == 1          # cached: no second fetch


async def test_a_stalled_model_list_never_blocks_and_times_out(llm, make_agent, caplog):
    llm.models_stall = True
    agent = make_agent(models_timeout_s=0.2)
    assert agent.models() == ["scripted-model"]
    await poll(lambda: agent.catalog.last_error is not None)
    assert agent.models() == ["scripted-model"]
    assert "model list of the endpoint not available" in caplog.text


async def test_a_failing_model_list_keeps_the_configured_models(llm, make_agent):
    llm.models_status = 404
    agent = make_agent(models=["alt"])
    assert await agent.catalog.refresh() == ["scripted-model", "alt"]
    assert "HTTP 404" in agent.catalog.last_error


async def test_model_list_can_be_turned_off(llm, make_agent):
    agent = make_agent(models_from_endpoint=False)
    assert agent.models() == ["scripted-model"] and agent.catalog._task is None   # nothing started
    assert await agent.catalog.refresh() == ["scripted-model"] and llm.model_requests == []


async def test_refresh_after_the_ttl():
    now = [0.0]
    calls: list[int] = []

    async def fetch() -> list[str]:
        calls.append(1)
        return [f"m{len(calls)}"]

    catalog = ModelCatalog(["base"], fetch, ttl_s=10, clock=lambda: now[0])
    await catalog.refresh()
    assert catalog.offered() == ["base", "m1"] and len(calls) == 1
    now[0] = 11.0
    catalog.offered()                                  # stale: one refresh starts
    await poll(lambda: catalog.offered() == ["base", "m2"])
    await catalog.aclose()
