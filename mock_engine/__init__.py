"""An OpenAI-compatible engine simulator: a pure, steppable core driven by an asyncio server."""
