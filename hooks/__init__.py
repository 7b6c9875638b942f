"""mvc_hooks: training-loop integration for mvc (imports only mvc's public API)."""
