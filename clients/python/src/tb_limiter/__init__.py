"""Python client of the tb Redis module: a fleet-wide token bucket.

    from tb_limiter import Limiter

    limiter = Limiter("redis://127.0.0.1:6379/0")
    llm = limiter.bucket("llm:openai", rate="0.5", capacity=1)
    r = llm.consume()            # Result(allowed, remaining, retry_after_ms, ...)
    llm.acquire(timeout=30)      # waits without polling (BLOCK or RESERVE)

Uses the module when the server has it and a Lua script with the same
replies otherwise. Fork-safe: connections are made lazily per process.
"""

from ._protocol import SCRIPT, Call
from ._spec import BucketSpec
from ._types import Backend, BucketInfo, MultiResult, RateLimited, Result
from .aio import AsyncLimit, AsyncLimiter, AsyncTokenBucket
from .sync import Limit, Limiter, TokenBucket

__all__ = [
    "AsyncLimit",
    "AsyncLimiter",
    "AsyncTokenBucket",
    "Backend",
    "BucketInfo",
    "BucketSpec",
    "Call",
    "Limit",
    "Limiter",
    "MultiResult",
    "RateLimited",
    "Result",
    "SCRIPT",
    "TokenBucket",
]
