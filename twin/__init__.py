"""ServeTwin: a discrete-event digital twin of LLM serving deployments."""

__version__ = "0.1.0"
