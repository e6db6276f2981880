"""The HTTP serving runtime: FastAPI app, TokenizerManager and the process launcher."""
