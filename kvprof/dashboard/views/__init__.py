"""One module per dashboard page; each has ``render(ctx)`` and reads only what analyze wrote."""
