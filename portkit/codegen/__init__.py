"""From scheduled work to source: index math, rewrites of missing ops, C-like renderers."""
