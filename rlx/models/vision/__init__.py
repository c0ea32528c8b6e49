"""Image models (placeholder)."""
