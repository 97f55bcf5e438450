"""The built-in example configs (`twin run --example NAME`): chat, disagg, agentic, dp_attention."""
