"""Agents: the OpenAI-compatible tool-calling agent, the offline agent, their config and factory."""
