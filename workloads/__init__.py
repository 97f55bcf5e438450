"""Where requests come from: the session-script format, generators, trace readers and converters.

Nothing here imports ``simpy``, ``twin`` or ``hardware``, and nothing is loaded at import time.
"""

from workloads.errors import WorkloadFormatError, WorkloadWarning
from workloads.sessions import FORMAT_NAME, FORMAT_VERSION, Call, Session, prompt_tokens, session_to_dict

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Call",
    "Session",
    "WorkloadFormatError",
    "WorkloadWarning",
    "prompt_tokens",
    "session_to_dict",
]
