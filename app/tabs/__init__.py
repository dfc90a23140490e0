"""One module per tab: pure handler functions plus a ``build(ctx, shared)`` that wires them to components."""
