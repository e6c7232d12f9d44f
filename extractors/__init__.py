"""Intent and rationale extraction (design/EXTRACTION.md); knows nothing about Prefect.

Entry points: ``pipeline.extract_lake`` / ``pipeline.extract_bucket`` (the stage),
``leakage.find_leaks`` (the independent checker), ``client.LLMClient`` (the
OpenAI-compatible client), ``fakeserver.FakeOpenAIServer`` (a local server for
tests and benchmarks), ``config.ExtractSettings`` (every knob).
"""
